from django.core.exceptions import ValidationError
from django.db import models
from django.db.models.signals import pre_delete
from django.dispatch import receiver

DEFAULT_SEGMENT_SLUG = "default"


class Segment(models.Model):
    """A group of users that shares one set of caps.

    Segments are mutually exclusive: a user in several segments' lists belongs to the one with
    the lowest `priority` number. Users in no list belong to the default segment.
    """

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    priority = models.IntegerField(
        unique=True, help_text="Lower wins: a user in several lists belongs to the lowest number."
    )
    description = models.TextField(blank=True)
    is_default = models.BooleanField(
        default=False, editable=False, help_text="Users in no list belong to this segment."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["priority"]
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"],
                condition=models.Q(is_default=True),
                name="segments_one_default_segment",
            )
        ]

    def __str__(self) -> str:
        return self.name


class DefaultSegmentProtected(ValidationError):
    pass


@receiver(pre_delete, sender=Segment)
def _protect_default_segment(sender: type[Segment], instance: Segment, **kwargs: object) -> None:
    # A signal, not an overridden delete(): it also guards queryset deletes and admin bulk deletes.
    if instance.is_default:
        raise DefaultSegmentProtected(
            f"The default segment '{instance.slug}' cannot be deleted: "
            "users in no list belong to it."
        )

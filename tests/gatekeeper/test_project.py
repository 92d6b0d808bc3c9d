import pytest
from django.core.management import call_command
from django.db import transaction

from limits.models import Cap
from segments.models import DefaultSegmentProtected, Segment


@pytest.mark.django_db
def test_the_default_segment_exists_after_migrating():
    default = Segment.objects.get(is_default=True)
    assert default.slug == "default"


@pytest.mark.django_db
def test_the_default_segment_cannot_be_deleted():
    default = Segment.objects.get(is_default=True)
    with pytest.raises(DefaultSegmentProtected), transaction.atomic():
        default.delete()
    with pytest.raises(DefaultSegmentProtected), transaction.atomic():
        Segment.objects.all().delete()
    assert Segment.objects.filter(is_default=True).exists()


@pytest.mark.django_db
def test_a_cap_names_a_known_channel():
    from django.core.exceptions import ValidationError

    default = Segment.objects.get(is_default=True)
    cap = Cap(segment=default, channel="fax", daily=1)
    with pytest.raises(ValidationError, match="Unknown channel 'fax'"):
        cap.full_clean()


@pytest.mark.django_db
def test_migrations_match_the_models():
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)

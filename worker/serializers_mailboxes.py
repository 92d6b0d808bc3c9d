"""Answer shapes of the mailbox providers and the warm-up plans (worker/api_mailboxes.py): for
the schema only; the views answer what worker.delivery.mailbox_settings shows."""

from rest_framework import serializers


class RateSerializer(serializers.Serializer):
    dispatcher = serializers.CharField(help_text="A provider's name, or `*`: every dispatcher.")
    per_second = serializers.FloatField(allow_null=True)
    per_minute = serializers.FloatField(allow_null=True)
    per_hour = serializers.FloatField(allow_null=True)


class MailboxProviderSerializer(serializers.Serializer):
    """A mailbox provider: a group of recipient domains, its rates and its brake's state."""

    slug = serializers.CharField()
    name = serializers.CharField()
    domains = serializers.ListField(child=serializers.CharField())
    mx_hosts = serializers.ListField(child=serializers.CharField())
    rates = RateSerializer(many=True)
    paused = serializers.BooleanField(
        help_text="Its brake stopped its email (complaints or hard bounces too high): it waits "
        "until someone resumes the group (POST .../resume/)."
    )
    paused_at = serializers.DateTimeField(allow_null=True)
    paused_why = serializers.DictField(
        allow_null=True,
        help_text="While paused, the figures the brake read: complaints, delivered, "
        "complaint_rate, bounces, bounce_rate, and `words`.",
    )
    resumed_at = serializers.DateTimeField(
        allow_null=True, help_text="Last resumed: the brake counts only mail sent since."
    )
    waiting = serializers.IntegerField(
        help_text="Recipients whose email waits for this group's brake."
    )


class WarmupGroupTodaySerializer(serializers.Serializer):
    volume = serializers.IntegerField(
        allow_null=True,
        help_text="Today's volume; null: not held today (before the first day, or its ramp ended).",
    )
    sent = serializers.IntegerField(
        allow_null=True,
        help_text="The messages it got from the domain today; null: Redis did not answer.",
    )
    waiting = serializers.IntegerField(help_text="Recipients held for a next day.")


class WarmupTodaySerializer(serializers.Serializer):
    day = serializers.IntegerField(
        allow_null=True, help_text="1 on the plan's first day; null before it."
    )
    date = serializers.DateField(help_text="Today in the plan's time zone.")
    next_day_at = serializers.DateTimeField(help_text="When the next day starts.")
    groups = serializers.DictField(
        child=WarmupGroupTodaySerializer(), help_text="Per group the plan names."
    )


class WarmupSerializer(serializers.Serializer):
    """A sending domain's warm-up plan, with today as it stands."""

    id = serializers.IntegerField()
    domain = serializers.CharField()
    time_zone = serializers.CharField()
    starts_on = serializers.DateField()
    volumes = serializers.DictField(
        child=serializers.ListField(child=serializers.IntegerField()),
        help_text="Per group, its volume for each day from the first.",
    )
    ended = serializers.DictField(
        child=serializers.DateField(),
        help_text="Groups whose ramp ended (a day's sends reached the last day's volume), and "
        "the day: no longer held.",
    )
    over = serializers.BooleanField(help_text="Every group's ramp ended: it holds nothing.")
    today = WarmupTodaySerializer()

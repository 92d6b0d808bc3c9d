import django.db.models.deletion
from django.db import migrations, models

import limits.channels


class Migration(migrations.Migration):
    initial = True

    dependencies = [("segments", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="Cap",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("channel", models.CharField(max_length=32, validators=[limits.channels.validate_scope])),
                (
                    "daily",
                    models.PositiveIntegerField(
                        blank=True, help_text="Most sends in any 24 hours. Empty: no daily cap.", null=True
                    ),
                ),
                (
                    "weekly",
                    models.PositiveIntegerField(
                        blank=True, help_text="Most sends in any 7 days. Empty: no weekly cap.", null=True
                    ),
                ),
                ("updated_at", models.DateTimeField(auto_now=True)),
                (
                    "segment",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="caps", to="segments.segment"
                    ),
                ),
            ],
            options={"ordering": ["segment__priority", "channel"]},
        ),
        migrations.AddConstraint(
            model_name="cap",
            constraint=models.UniqueConstraint(fields=("segment", "channel"), name="limits_one_cap_per_scope"),
        ),
    ]

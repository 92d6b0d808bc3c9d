# A chunk's recipients are encoded and decoded by msgspec: the same JSON text in the same
# column, so the database is not touched (SQLite would otherwise copy the whole table).

from django.db import migrations, models

import worker.models


class Migration(migrations.Migration):
    dependencies = [
        ("worker", "0007_job_files"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="sendchunk",
                    name="recipients",
                    field=models.JSONField(
                        decoder=worker.models.CompactJSONDecoder,
                        encoder=worker.models.CompactJSONEncoder,
                        help_text="[{user_id, address, message_id, context, time_zone (when given)}]",
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]

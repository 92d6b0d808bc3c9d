# A rule's change record keeps what the rule read as under the name every change record uses.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("limits", "0011_suppressions"),
    ]

    operations = [
        migrations.RenameField(model_name="rulechange", old_name="rule_name", new_name="label"),
        migrations.AlterField(
            model_name="rulechange",
            name="label",
            field=models.CharField(help_text="The row as it read at the change.", max_length=100),
        ),
        migrations.AlterField(
            model_name="quiethourschange",
            name="label",
            field=models.CharField(help_text="The row as it read at the change.", max_length=100),
        ),
        migrations.AlterField(
            model_name="quiethourschange",
            name="via",
            field=models.CharField(
                default="admin", help_text="admin, api, cap or command", max_length=16
            ),
        ),
    ]

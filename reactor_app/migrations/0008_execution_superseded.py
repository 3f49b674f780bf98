# Debounce (reactor_app.engine.debounce): a start replaced by a later one of its burst ends
# "superseded" and names the execution that ran instead.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("reactor_app", "0007_execution_claim_generation"),
    ]

    operations = [
        migrations.AddField(
            model_name="execution",
            name="superseded_by",
            field=models.ForeignKey(
                blank=True,
                help_text="a superseded start of a debounce burst: the execution that ran instead",
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="supersedes",
                to="reactor_app.execution",
            ),
        ),
        migrations.AlterField(
            model_name="execution",
            name="status",
            field=models.CharField(
                choices=[
                    ("pending", "pending"),
                    ("running", "running"),
                    ("parked", "parked"),
                    ("interrupted", "interrupted"),
                    ("succeeded", "succeeded"),
                    ("failed", "failed"),
                    ("halted", "halted"),
                    ("cancelled", "cancelled"),
                    ("superseded", "superseded"),
                ],
                default="pending",
                max_length=16,
            ),
        ),
    ]

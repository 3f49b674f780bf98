# Append-only progress rows (reactor_app.engine.progress): results, the rollback log and
# sequential maps' progress leave Execution.context. Rows written before it keep those parts in
# their context and read as they are; no data migration.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("reactor_app", "0009_limit_override"),
    ]

    operations = [
        migrations.CreateModel(
            name="ExecutionProgress",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "seq",
                    models.PositiveBigIntegerField(
                        help_text="1, 2, ... per execution: the order to apply"
                    ),
                ),
                ("kind", models.CharField(help_text="set, extend or remove", max_length=8)),
                (
                    "path",
                    models.JSONField(default=list, help_text="where in the state, key by key"),
                ),
                ("payload", models.JSONField(blank=True, null=True)),
                (
                    "execution",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="progress",
                        to="reactor_app.execution",
                    ),
                ),
            ],
            options={
                "verbose_name_plural": "execution progress",
                "ordering": ("execution", "seq"),
                "constraints": [
                    models.UniqueConstraint(
                        fields=("execution", "seq"), name="reactor_progress_seq_uniq"
                    )
                ],
            },
        ),
    ]

# Four foreign keys lose the index Django gives a ForeignKey by default: each was already the
# leading column of another index (root: reactor_exec_root_idx; a step run's, a contention
# row's and an event's execution: their (execution, ...) index or unique constraint), so the
# second copy only cost every insert, and every status write of an execution, one more index
# entry. Only the indexes are dropped: the foreign-key constraints stay as they are (letting
# Django alter the fields would drop and re-add each constraint, re-checking every row of the
# table under a lock). The index names are the ones Django gave them, the same on every
# backend.

import django.db.models.deletion
from django.db import migrations, models

DROPPED = [
    ("reactor_app_contentionstate", "reactor_app_contentionstate_execution_id_72975c96", "execution_id"),
    ("reactor_app_coordinationevent", "reactor_app_coordinationevent_execution_id_f37b2db5", "execution_id"),
    ("reactor_app_execution", "reactor_app_execution_root_id_a7090246", "root_id"),
    ("reactor_app_steprun", "reactor_app_steprun_execution_id_5de2dcca", "execution_id"),
]


class Migration(migrations.Migration):
    dependencies = [
        ("reactor_app", "0010_executionprogress"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    sql=f'DROP INDEX IF EXISTS "{index}"',
                    reverse_sql=f'CREATE INDEX "{index}" ON "{table}" ("{column}")',
                )
                for table, index, column in DROPPED
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="contentionstate",
                    name="execution",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="contention",
                        to="reactor_app.execution",
                    ),
                ),
                migrations.AlterField(
                    model_name="coordinationevent",
                    name="execution",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="coordination_events",
                        to="reactor_app.execution",
                    ),
                ),
                migrations.AlterField(
                    model_name="execution",
                    name="root",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="tree",
                        to="reactor_app.execution",
                    ),
                ),
                migrations.AlterField(
                    model_name="steprun",
                    name="execution",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="step_runs",
                        to="reactor_app.execution",
                    ),
                ),
            ],
        ),
    ]

"""``Execution`` reads its related rows (parent, root, retry, replacement) through ``objects``,
which reads where rows are written (``reactor_app.databases``). Options only: no SQL."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("reactor_app", "0011_drop_duplicate_fk_indexes"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="execution",
            options={
                "base_manager_name": "objects",
                "ordering": ("-created_at",),
                "permissions": [("cancel_execution", "Can cancel executions")],
            },
        ),
    ]

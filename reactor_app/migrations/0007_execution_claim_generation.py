from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("reactor_app", "0006_coordinationevent_release_failed"),
    ]

    operations = [
        migrations.AddField(
            model_name="execution",
            name="claim_generation",
            field=models.PositiveBigIntegerField(
                default=0,
                editable=False,
                help_text=(
                    "incremented by each worker delivery's claim; the delivery's later writes "
                    "are conditional on it (a delivery that lost its claim writes nothing)"
                ),
            ),
        ),
    ]

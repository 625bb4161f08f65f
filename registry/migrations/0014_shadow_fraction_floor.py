"""Rollouts saved before shadows had a floor (traffic.MIN_SHADOW_FRACTION) keep a
shadow_fraction below it, which every step they take again would refuse ("routes[1].shadow
must be ..."): a paused one could not be resumed. They mirror one request in 10,000 now,
which is the least the console issues."""

from django.db import migrations

MIN_SHADOW_FRACTION = 0.0001  # registry.domain.traffic's, as it was when this was written
ACTIVE = ("running", "paused", "waiting_for_data")  # a finished rollout's record stays as it ran


def raise_to_the_floor(apps, schema_editor):
    Rollout = apps.get_model("registry", "Rollout")
    Rollout.objects.filter(status__in=ACTIVE, shadow_fraction__lt=MIN_SHADOW_FRACTION).update(shadow_fraction=MIN_SHADOW_FRACTION)


class Migration(migrations.Migration):

    dependencies = [
        ("registry", "0013_list_indexes"),
    ]

    operations = [
        migrations.RunPython(raise_to_the_floor, migrations.RunPython.noop),
    ]

"""Analysis settings saved before alpha had a floor (canary_analysis.MIN_ALPHA) may hold
alpha 0, which no gate can fail at and which every window judged again would refuse
("analysis.alpha must be ..."): a running rollout could not be judged, and a model's
defaults could not start one. They take the floor now, the strictest a user may ask."""

from django.db import migrations

MIN_ALPHA = 0.001  # registry.domain.canary_analysis's, as it was when this was written
ACTIVE = ("running", "paused", "waiting_for_data")  # a finished rollout's record stays as it ran


def _floored(analysis):
    alpha = analysis.get("alpha") if isinstance(analysis, dict) else None
    if isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and alpha < MIN_ALPHA:
        return {**analysis, "alpha": MIN_ALPHA}
    return None


def raise_to_the_floor(apps, schema_editor):
    for model, rows in ((apps.get_model("registry", "RegisteredModel"), None), (apps.get_model("registry", "Rollout"), ACTIVE)):
        queryset = model.objects.all() if rows is None else model.objects.filter(status__in=rows)
        for pk, analysis in queryset.values_list("pk", "analysis"):
            floored = _floored(analysis)
            if floored is not None:
                model.objects.filter(pk=pk).update(analysis=floored)


class Migration(migrations.Migration):

    dependencies = [
        ("registry", "0020_drill_failed_requests_big"),
    ]

    operations = [
        migrations.RunPython(raise_to_the_floor, migrations.RunPython.noop),
    ]

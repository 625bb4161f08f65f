"""Model names are unique ignoring case: "MyModel" and "mymodel" were two models, and a
client that got the case wrong was answered by the other one. A database that already
holds such a pair is named here rather than left to the constraint's bare error."""

from django.core.management.base import CommandError
from django.db import migrations, models
from django.db.models.functions import Lower


def refuse_names_differing_only_by_case(apps, schema_editor):
    RegisteredModel = apps.get_model("registry", "RegisteredModel")
    seen: dict[str, str] = {}
    clashes = []
    for name in RegisteredModel.objects.order_by("name").values_list("name", flat=True):
        if name.lower() in seen:
            clashes.append(f"{seen[name.lower()]!r} and {name!r}")
        seen.setdefault(name.lower(), name)
    if clashes:
        # CommandError: migrate prints it as one line, not a traceback.
        raise CommandError("model names must now differ by more than case; rename one of each pair in the database "
                           f"(registry_registeredmodel.name; workers serve it under its new name) and migrate again: {', '.join(clashes)}")


class Migration(migrations.Migration):

    dependencies = [
        ("registry", "0014_shadow_fraction_floor"),
    ]

    operations = [
        migrations.RunPython(refuse_names_differing_only_by_case, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="registeredmodel",
            constraint=models.UniqueConstraint(Lower("name"), name="registry_model_name_unique_ignoring_case"),
        ),
    ]

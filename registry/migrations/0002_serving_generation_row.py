from django.db import migrations


def create_row(apps, schema_editor):
    apps.get_model("registry", "ServingGeneration").objects.get_or_create(pk=1)


def create_groups(apps, schema_editor):
    group = apps.get_model("auth", "Group")
    for name in ("viewer", "operator", "admin"):
        group.objects.get_or_create(name=name)


class Migration(migrations.Migration):
    """The single generation counter row, and the role groups, exist from the start."""

    dependencies = [("registry", "0001_initial"), ("auth", "0012_alter_user_first_name_max_length")]

    operations = [
        migrations.RunPython(create_row, migrations.RunPython.noop),
        migrations.RunPython(create_groups, migrations.RunPython.noop),
    ]

"""Tags, an owner and an archive flag on registered models, and the archive release action;
existing models are owned by whoever created them."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def owners_are_creators(apps, schema_editor):
    RegisteredModel = apps.get_model("registry", "RegisteredModel")
    RegisteredModel.objects.filter(owner__isnull=True).update(owner=models.F("created_by"))


class Migration(migrations.Migration):

    dependencies = [
        ('registry', '0006_jobs'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='registeredmodel',
            name='archived_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='registeredmodel',
            name='owner',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='owned_models', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name='registeredmodel',
            name='tags',
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AlterField(
            model_name='auditevent',
            name='kind',
            field=models.CharField(choices=[('model_created', 'Model registered'), ('model_changed', 'Model details changed'), ('model_archived', 'Model archived'), ('model_restored', 'Model restored from the archive'), ('version_uploaded', 'Version uploaded'), ('upload_refused', 'Upload refused'), ('version_archived', 'Version archived'), ('release', 'Traffic changed'), ('drill', 'Rollback drill'), ('rollout', 'Rollout'), ('dataset_added', 'Evaluation data set added'), ('job', 'Job')], max_length=32),
        ),
        migrations.AlterField(
            model_name='release',
            name='action',
            field=models.CharField(choices=[('initial', 'First version routed'), ('set_routes', 'Traffic split changed'), ('promote', 'Canary promoted'), ('rollback', 'Rolled back'), ('restore', 'Earlier release restored'), ('archive', 'Archived: serves nothing')], max_length=16),
        ),
        migrations.RunPython(owners_are_creators, migrations.RunPython.noop),
    ]

from django.urls import path

from registry.api import (
    audit_views,
    drills_views,
    models_views,
    releases_views,
    serving_keys_views,
    serving_views,
    versions_views,
    workers_views,
)

urlpatterns = [
    path("models/", models_views.ModelList.as_view(), name="api-models"),
    path("models/<slug:name>/", models_views.ModelDetail.as_view(), name="api-model"),
    path("models/<slug:name>/versions/", versions_views.VersionList.as_view(), name="api-versions"),
    path("models/<slug:name>/versions/<int:number>/", versions_views.VersionDetail.as_view(), name="api-version"),
    path("models/<slug:name>/versions/<int:number>/artifact", versions_views.VersionArtifact.as_view(), name="api-version-artifact"),
    path("models/<slug:name>/versions/<int:number>/metrics/", versions_views.VersionMetricHistory.as_view(), name="api-version-metrics"),
    path("models/<slug:name>/releases/", releases_views.ReleaseHistory.as_view(), name="api-releases"),
    path("models/<slug:name>/release/", releases_views.CurrentRelease.as_view(), name="api-release"),
    path("models/<slug:name>/release/promote/", releases_views.Promote.as_view(), name="api-release-promote"),
    path("models/<slug:name>/release/rollback/", releases_views.Rollback.as_view(), name="api-release-rollback"),
    path("models/<slug:name>/release/restore/", releases_views.Restore.as_view(), name="api-release-restore"),
    path("models/<slug:name>/drills/", drills_views.Drills.as_view(), name="api-drills"),
    path("models/<slug:name>/audit/", audit_views.Audit.as_view(), name="api-audit"),
    path("workers/", workers_views.Workers.as_view(), name="api-workers"),
    path("drills/", drills_views.AllDrills.as_view(), name="api-all-drills"),
    path("serving/state", serving_views.ServingState.as_view(), name="api-serving-state"),
    path("serving/acks", serving_views.WorkerAcks.as_view(), name="api-serving-acks"),
    path("serving/reports", serving_views.WorkerReports.as_view(), name="api-serving-reports"),
    path("serving/api-keys", serving_keys_views.ServingApiKeys.as_view(), name="api-serving-api-keys"),
]

from django.urls import path

from registry.api import release_views, serving_keys_views, views

urlpatterns = [
    path("models/", views.ModelList.as_view(), name="api-models"),
    path("models/<slug:name>/", views.ModelDetail.as_view(), name="api-model"),
    path("models/<slug:name>/versions/", views.VersionList.as_view(), name="api-versions"),
    path("models/<slug:name>/versions/<int:number>/", views.VersionDetail.as_view(), name="api-version"),
    path("models/<slug:name>/versions/<int:number>/artifact", views.VersionArtifact.as_view(), name="api-version-artifact"),
    path("models/<slug:name>/versions/<int:number>/metrics/", views.VersionMetricHistory.as_view(), name="api-version-metrics"),
    path("models/<slug:name>/releases/", views.ReleaseHistory.as_view(), name="api-releases"),
    path("models/<slug:name>/release/", release_views.CurrentRelease.as_view(), name="api-release"),
    path("models/<slug:name>/release/promote/", release_views.Promote.as_view(), name="api-release-promote"),
    path("models/<slug:name>/release/rollback/", release_views.Rollback.as_view(), name="api-release-rollback"),
    path("models/<slug:name>/release/restore/", release_views.Restore.as_view(), name="api-release-restore"),
    path("models/<slug:name>/drills/", release_views.Drills.as_view(), name="api-drills"),
    path("models/<slug:name>/audit/", release_views.Audit.as_view(), name="api-audit"),
    path("workers/", release_views.Workers.as_view(), name="api-workers"),
    path("drills/", release_views.AllDrills.as_view(), name="api-all-drills"),
    path("serving/state", views.ServingState.as_view(), name="api-serving-state"),
    path("serving/acks", release_views.WorkerAcks.as_view(), name="api-serving-acks"),
    path("serving/reports", release_views.WorkerReports.as_view(), name="api-serving-reports"),
    path("serving/api-keys", serving_keys_views.ServingApiKeys.as_view(), name="api-serving-api-keys"),
]

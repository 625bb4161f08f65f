from django.contrib.auth import views as auth_views
from django.urls import path

from console import job_views, metrics, registry_views, rollout_views, views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.models_page, name="models"),
    path("models/", registry_views.create_model, name="model-create"),
    path("models/<slug:name>/", views.model_page, name="model"),
    path("models/<slug:name>/details/", registry_views.change_model, name="model-details"),
    path("models/<slug:name>/archive/", registry_views.archive_model, name="model-archive"),
    path("models/<slug:name>/unarchive/", registry_views.unarchive_model, name="model-unarchive"),
    path("models/<slug:name>/upload/", views.upload_version, name="model-upload"),
    path("models/<slug:name>/split/", views.set_split, name="model-split"),
    path("models/<slug:name>/promote/", views.promote, name="model-promote"),
    path("models/<slug:name>/rollback/", views.rollback, name="model-rollback"),
    path("models/<slug:name>/drill/", views.drill, name="model-drill"),
    path("models/<slug:name>/to-stable/", views.to_stable, name="model-to-stable"),
    path("models/<slug:name>/releases/<int:generation>/", views.release_page, name="model-release"),
    path("models/<slug:name>/rollouts/", rollout_views.start_rollout, name="model-rollout-start"),
    path("models/<slug:name>/rollouts/<int:pk>/", rollout_views.rollout_page, name="model-rollout"),
    path("models/<slug:name>/rollouts/<int:pk>/pause/", rollout_views.pause_rollout, name="model-rollout-pause"),
    path("models/<slug:name>/rollouts/<int:pk>/resume/", rollout_views.resume_rollout, name="model-rollout-resume"),
    path("models/<slug:name>/rollouts/<int:pk>/abort/", rollout_views.abort_rollout, name="model-rollout-abort"),
    path("models/<slug:name>/jobs/", job_views.jobs_page, name="model-jobs"),
    path("models/<slug:name>/jobs/new", job_views.new_batch_job, name="model-jobs-new"),
    path("models/<slug:name>/jobs/<int:pk>/cancel", job_views.cancel_job, name="model-job-cancel"),
    path("models/<slug:name>/datasets/new", job_views.new_dataset, name="model-datasets-new"),
    path("models/<slug:name>/versions/<int:number>/", views.version_page, name="version"),
    path("models/<slug:name>/versions/<int:number>/try/", views.try_version, name="version-try"),
    path("workers/", views.workers_page, name="workers"),
    path("drills/", views.drills_page, name="drills"),
]

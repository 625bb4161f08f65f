from django.contrib.auth import views as auth_views
from django.urls import path

from console import views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.models_page, name="models"),
    path("models/<slug:name>/", views.model_page, name="model"),
    path("models/<slug:name>/upload/", views.upload_version, name="model-upload"),
    path("models/<slug:name>/split/", views.set_split, name="model-split"),
    path("models/<slug:name>/promote/", views.promote, name="model-promote"),
    path("models/<slug:name>/rollback/", views.rollback, name="model-rollback"),
    path("models/<slug:name>/drill/", views.drill, name="model-drill"),
    path("models/<slug:name>/versions/<int:number>/", views.version_page, name="version"),
    path("models/<slug:name>/versions/<int:number>/try/", views.try_version, name="version-try"),
    path("workers/", views.workers_page, name="workers"),
    path("drills/", views.drills_page, name="drills"),
]

from django.contrib import admin
from django.urls import include, path

from registry.api.schema_view import SchemaView

handler403 = "console.views.permission_denied"
handler404 = "console.views.not_found"
handler500 = "console.views.server_error"

urlpatterns = [
    path("api/", include("registry.api.urls")),
    path("api/schema/", SchemaView.as_view(), name="api-schema"),
    path("admin/", admin.site.urls),
    path("", include("console.ui_urls")),
]

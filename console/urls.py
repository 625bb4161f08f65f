from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

handler403 = "console.views.permission_denied"
handler404 = "console.views.not_found"
handler500 = "console.views.server_error"

urlpatterns = [
    path("api/", include("registry.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("admin/", admin.site.urls),
    path("", include("console.ui_urls")),
]

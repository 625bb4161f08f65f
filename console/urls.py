from django.contrib import admin
from django.urls import include, path

from console.user_forms import AdminSignInForm
from registry.api.schema_view import SchemaView

admin.site.login_form = AdminSignInForm  # a user name too long for any is refused before it is tried

handler403 = "console.views.permission_denied"
handler404 = "console.views.not_found"
handler500 = "console.views.server_error"

urlpatterns = [
    path("api/", include("registry.api.urls")),
    path("api/schema/", SchemaView.as_view(), name="api-schema"),
    path("admin/", admin.site.urls),
    path("", include("console.ui_urls")),
]

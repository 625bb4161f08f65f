from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from console.user_forms import AdminSignInForm
from registry.api.schema_view import SchemaView

admin.site.login_form = AdminSignInForm  # a user name too long for any is refused before it is tried

handler400 = "console.views.bad_request"
handler403 = "console.views.permission_denied"
handler404 = "console.views.not_found"
handler500 = "console.views.server_error"

urlpatterns = [
    path("api/", include("registry.api.urls")),
    path("api/schema/", SchemaView.as_view(), name="api-schema"),
    # The console's page counts wrong old passwords towards the sign-in lockout; the Django
    # admin's own would not.
    path("admin/password_change/", RedirectView.as_view(pattern_name="password-change")),
    path("admin/", admin.site.urls),
    path("", include("console.ui_urls")),
]

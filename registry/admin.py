"""Django admin for inference API keys (staff with the model's permissions only).

Adding a key asks only for a name; the key is generated, shown once as the add form's own
answer, and only its sha256 is stored (shown in a message, it was kept in clear in the
session table until the next page read it, for two weeks if none did). Keys are revoked (an action), never deleted, and
a saved key's fields cannot be edited: to rotate, create a new key and revoke the old one.

People are deactivated, never deleted, here as in the console: a delete took the user's
Django admin history (who deactivated whom, who reset which password) with it, and cleared
their name on what they did (those links are PROTECT now).

DRF's own admin for users' API tokens is taken off the site: it listed every user's token
key in clear to every admin-group member, a superuser's included, where the console's user
pages show a key once, to whoever issued it, and keep it only in DRF's table.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.template.response import TemplateResponse
from django.utils.cache import add_never_cache_headers
from rest_framework.authtoken.models import TokenProxy

from registry.actions import api_keys, users
from registry.domain import roles
from registry.models import InferenceApiKey

if admin.site.is_registered(TokenProxy):  # registered by rest_framework.authtoken, earlier in INSTALLED_APPS
    admin.site.unregister(TokenProxy)


class KeptUserAdmin(UserAdmin):
    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # deactivate instead (the console's Users & roles, or Active here)

    def get_form(self, request, obj=None, change=False, **kwargs):
        """The change form keeps the console's rules on admins: here an admin deactivated or
        demoted themself, and the last active admin lost their rights (a shell to recover)."""
        form = super().get_form(request, obj, change=change, **kwargs)
        if obj is None:
            return form

        class KeptAdminsForm(form):
            def clean(self):
                data = super().clean()
                groups = data.get("groups") or []
                stays_admin = data.get("is_active") and (data.get("is_superuser") or any(group.name == roles.ADMIN for group in groups))
                if not stays_admin:
                    try:
                        users.refuse_losing_admin(obj, request.user)
                    except users.UserAdminError as refusal:
                        raise ValidationError(refusal.message) from None
                return data

        return KeptAdminsForm

    def user_change_password(self, request, id, form_url=""):
        """Django's own form changes the hash only: the user's API token is revoked with it,
        in one transaction, as the Users page's reset does."""
        if request.method != "POST":
            return super().user_change_password(request, id, form_url)
        with transaction.atomic():
            user = self.get_object(request, unquote(id))
            # Locked: a change the user made to their own password meanwhile is not taken for the admin's.
            before = None if user is None else User.objects.select_for_update().filter(pk=user.pk).values_list("password", flat=True).first()
            response = super().user_change_password(request, id, form_url)
            saved = response.status_code == 302 and user is not None
            if saved and User.objects.filter(pk=user.pk).values_list("password", flat=True).first() != before:
                users.password_set_by_admin(user, request.user)
        return response


if admin.site.is_registered(User):
    admin.site.unregister(User)
admin.site.register(User, KeptUserAdmin)


@admin.register(InferenceApiKey)
class InferenceApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix", "created_by", "created_at", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("name", "prefix")
    actions = ("revoke",)

    def get_fields(self, request, obj=None):
        return ("name",) if obj is None else ("name", "prefix", "created_by", "created_at", "revoked_at")

    def get_readonly_fields(self, request, obj=None):
        return () if obj is None else ("name", "prefix", "created_by", "created_at", "revoked_at")

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # a revoked row keeps saying whose key it was

    def save_model(self, request, obj, form, change):
        if change:
            return  # nothing of a saved key is editable
        _, request.new_api_key = api_keys.create_key(obj.name, request.user, row=obj)

    def response_add(self, request, obj, post_url_continue=None):
        """The new key, on this answer alone: never a message (stored in the session) or a redirect."""
        context = {**self.admin_site.each_context(request), "title": f"API key for “{obj.name}”", "key_row": obj,
                   "key": request.new_api_key, "opts": self.model._meta}
        response = TemplateResponse(request, "admin/registry/inferenceapikey/created.html", context)
        add_never_cache_headers(response)
        return response

    @admin.action(description="Revoke the selected keys", permissions=("change",))
    def revoke(self, request, queryset):
        count = api_keys.revoke_keys(queryset, request.user)
        self.message_user(request, f"{count} key(s) revoked; workers stop accepting them at their next refresh.",
                          messages.SUCCESS)

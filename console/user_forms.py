"""Forms of the users pages: they parse what an admin typed into the arguments of
``registry.actions.users``; the rules (last admin, no self-demotion) stay there."""

from __future__ import annotations

from django import forms
from django.contrib.auth.forms import PasswordChangeForm
from django.contrib.auth.models import User

from registry.domain import roles

ROLE_CHOICES = [(roles.VIEWER, "viewer: reads everything"), (roles.OPERATOR, "operator: uploads, changes traffic, runs drills"),
                (roles.ADMIN, "admin: also manages users")]


class NewUserForm(forms.Form):
    username = forms.CharField(label="User name", max_length=150, validators=[User.username_validator],
                               help_text="Letters, digits and @ . + - _ only.")
    email = forms.EmailField(label="Email (optional)", required=False)
    role = forms.ChoiceField(label="Role", choices=ROLE_CHOICES, initial=roles.VIEWER)

    def clean_username(self):
        username = self.cleaned_data["username"].strip()
        if User.objects.filter(username__iexact=username).exists():
            raise forms.ValidationError(f"a user named {username!r} exists already")
        return username


class RoleForm(forms.Form):
    role = forms.ChoiceField(label="New role", choices=ROLE_CHOICES)


class OwnPasswordForm(PasswordChangeForm):
    """Django's password change, refusing to keep the one-time password."""

    def clean(self):
        data = super().clean()
        password = data.get("new_password2")
        if password and self.user.check_password(password):
            self.add_error("new_password2", "choose a password other than the one you signed in with")
        return data

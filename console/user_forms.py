"""Forms of the users pages: they parse what an admin typed into the arguments of
``registry.actions.users``; the rules (last admin, no self-demotion) stay there."""

from __future__ import annotations

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import authenticate
from django.contrib.auth.forms import AuthenticationForm, PasswordChangeForm
from django.contrib.auth.models import User

from registry.domain import roles

ROLE_CHOICES = [(roles.VIEWER, "viewer: reads everything"), (roles.OPERATOR, "operator: uploads, changes traffic, runs drills"),
                (roles.ADMIN, "admin: also manages users")]


class NewUserForm(forms.Form):
    username = forms.CharField(label="User name", max_length=150, validators=[User.username_validator],
                               help_text="Letters, digits and @ . + - _ only.")
    # The column's length (RFC 5321's 254): a longer address was a 500 on PostgreSQL.
    email = forms.EmailField(label="Email (optional)", required=False, max_length=254)
    role = forms.ChoiceField(label="Role", choices=ROLE_CHOICES, initial=roles.VIEWER)

    def clean_username(self):
        username = self.cleaned_data["username"].strip()
        if User.objects.filter(username__iexact=username).exists():
            raise forms.ValidationError(f"a user named {username!r} exists already")
        return username


class RoleForm(forms.Form):
    role = forms.ChoiceField(label="New role", choices=ROLE_CHOICES)


class OwnPasswordForm(PasswordChangeForm):
    """Django's password change, refusing to keep the one-time password.

    The old password is checked through ``authenticate``, as a sign-in is: Django's own
    ``check_password`` went past django-axes, so whoever held a session (a stolen cookie,
    an unlocked screen) could guess the account's password there without limit. A wrong
    one counts towards the sign-in lockout; at the lockout the view ends the session."""

    def __init__(self, user, *args, request, **kwargs):
        self.request = request  # required: django-axes cannot count an attempt without it
        super().__init__(user, *args, **kwargs)

    def clean_old_password(self):
        old_password = self.cleaned_data["old_password"]
        if authenticate(self.request, username=self.user.get_username(), password=old_password) is None:
            raise forms.ValidationError(self.error_messages["password_incorrect"], code="password_incorrect")
        return old_password

    def clean(self):
        data = super().clean()
        password = data.get("new_password2")
        if password and self.user.check_password(password):
            self.add_error("new_password2", "choose a password other than the one you signed in with")
        return data


class SignInForm(AuthenticationForm):
    """Django's sign-in, refusing a user name longer than any can be before it is tried.

    Django sets the field's max_length after the field is built, so the length went
    unchecked to ``authenticate``, where django-axes records the failed attempt in a
    255-character column: a 256-character name, anonymous and one request, was a 500 on
    PostgreSQL (and a traceback in the log)."""

    def clean_username(self):
        username = self.cleaned_data["username"]
        limit = self.fields["username"].max_length
        if limit and len(username) > limit:
            raise forms.ValidationError(f"a user name has at most {limit} characters")
        return username


class AdminSignInForm(SignInForm, AdminAuthenticationForm):
    """The same check on the Django admin's sign-in."""

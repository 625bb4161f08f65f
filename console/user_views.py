"""Users pages, for admins: the list, a new user, one user's page, and a confirmation page
per change (role, deactivate, reactivate, password reset, API token, lockout). Views
translate; the rules live in ``registry.actions.users``.

A change is GET (the confirmation) then POST (act, message, redirect). A refused change
renders its confirmation again with the reason (400 bad input, 409 a rule). A new
password or token key is the POST's own answer, never a message or a redirect, so it
is stored nowhere (messages live in the session) and is not cached (``never_cache``).
"""

from __future__ import annotations

from functools import wraps

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db.models import Exists, OuterRef
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods
from rest_framework.authtoken.models import Token

from console.user_forms import NewUserForm, RoleForm
from registry.actions import users
from registry.domain import roles


def admin_required(view):
    """Signed in first; then anyone but an admin gets 403 and nothing runs."""

    @login_required
    @wraps(view)
    def guarded(request, *args, **kwargs):
        if not users.is_user_admin(request.user):
            raise PermissionDenied("only admins manage users")
        return view(request, *args, **kwargs)

    return guarded


@admin_required
def users_page(request):
    return render(request, "console/users.html", {"nav": "users", "rows": _rows()})


def _rows() -> list[dict]:
    people = (User.objects.order_by("username").prefetch_related("groups")
              .annotate(has_token=Exists(Token.objects.filter(user=OuterRef("pk")))))
    locked = users.locked_out_usernames()
    return [_row(person, locked) for person in people]


def _row(person: User, locked: set[str]) -> dict:
    groups = {group.name for group in person.groups.all()}  # prefetched: no query per user
    role = roles.ADMIN if person.is_superuser or roles.ADMIN in groups else roles.OPERATOR if roles.OPERATOR in groups else roles.VIEWER
    return {"user": person, "role": role, "has_token": person.has_token, "locked": person.username in locked,
            "must_change_password": users.MUST_CHANGE_PASSWORD_GROUP in groups}


@never_cache
@require_http_methods(["GET", "POST"])
@admin_required
def new_user(request):
    form = NewUserForm(request.POST or None)
    if request.method == "GET" or not form.is_valid():
        return render(request, "console/users_new.html", {"nav": "users", "form": form}, status=200 if request.method == "GET" else 400)
    data = form.cleaned_data
    try:
        person, password = users.create_user(data["username"], data["email"], data["role"], request.user)
    except users.UserAdminError as error:
        form.add_error(None, error.message)
        return render(request, "console/users_new.html", {"nav": "users", "form": form}, status=error.status)
    return _show_once(request, person, "password", password, f"{person.username} created as {data['role']}.")


@admin_required
def user_page(request, pk: int):
    person = get_object_or_404(User.objects.annotate(has_token=Exists(Token.objects.filter(user=OuterRef("pk")))), pk=pk)
    row = _row(person, users.locked_out_usernames())
    return render(request, "console/users_detail.html", {"nav": "users", "person": person, "row": row, "role_form": RoleForm(initial={"role": row["role"]}),
                                                          "is_self": person.pk == request.user.pk})


def _show_once(request, person: User, what: str, value: str, done: str):
    """The one page that shows a new password or token key."""
    return render(request, "console/users_secret.html", {"nav": "users", "person": person, "what": what, "secret": value, "done": done})


# ---------------------------------------------------------------- confirmed changes

CHANGES = {
    # name: (title, explanation, button, danger)
    "role": ("Change {name}'s role?", "They keep their password and token; what they may do changes at their next request.", "Change role", False),
    "deactivate": ("Deactivate {name}?", ("They can no longer sign in, their open sessions end (for good: reactivating them does not bring those back), "
                   "and their API token stops working. "
                   "Nothing they did is removed; you can reactivate them."), "Deactivate", True),
    "reactivate": ("Reactivate {name}?", "They can sign in again with their password, and their API token works again.", "Reactivate", False),
    "reset-password": ("Reset {name}'s password?", ("Their password is replaced by a one-time password, shown to you once; their open sessions end "
                       "and their API token, if any, stops working (issue a new one after). They choose a new password at their next sign-in."), "Reset password", True),
    "token": ("Issue a new API token for {name}?", "A new token key is shown to you once; the previous key, if any, stops working at once.", "Issue token", True),
    "revoke-token": ("Revoke {name}'s API token?", "Scripts using it get 401 from now on.", "Revoke token", True),
    "unlock": ("Lift {name}'s login lockout?", "Their failed sign-ins are forgotten and they can try again at once.", "Unlock", False),
}


@never_cache
@require_http_methods(["GET", "POST"])
@admin_required
def change_user(request, pk: int, change: str):
    person = get_object_or_404(User, pk=pk)
    form = RoleForm(request.POST if request.method == "POST" else request.GET or None) if change == "role" else None
    if request.method == "GET":
        return _confirm(request, person, change, form)
    if form is not None and not form.is_valid():
        return _confirm(request, person, change, form, status=400)
    try:
        return ACTIONS[change](request, person, form)
    except users.UserAdminError as error:
        return _confirm(request, person, change, form, error=error.message, status=error.status)


def _confirm(request, person: User, change: str, form, *, error: str = "", status: int = 200):
    title, text, button, danger = CHANGES[change]
    context = {"nav": "users", "person": person, "change": change, "form": form, "error": error, "title": title.format(name=person.username),
               "text": text, "button": button, "danger": danger}
    return render(request, "console/users_confirm.html", context, status=status)


def _done(request, person: User, text: str):
    messages.success(request, text)
    return redirect("user", pk=person.pk)


def _set_role(request, person, form):
    role = form.cleaned_data["role"]
    changed = users.set_role(person, role, request.user)
    return _done(request, person, f"{person.username} is now {role}." if changed else f"{person.username} was {role} already: nothing changed.")


def _deactivate(request, person, form):
    changed = users.deactivate(person, request.user)
    return _done(request, person, f"{person.username} deactivated: they can no longer sign in." if changed else f"{person.username} was inactive already.")


def _reactivate(request, person, form):
    changed = users.reactivate(person, request.user)
    return _done(request, person, f"{person.username} reactivated." if changed else f"{person.username} was active already.")


def _reset_password(request, person, form):
    return _show_once(request, person, "password", users.reset_password(person, request.user), f"{person.username}'s password reset.")


def _token(request, person, form):
    return _show_once(request, person, "token", users.rotate_token(person, request.user), f"New API token for {person.username}.")


def _revoke_token(request, person, form):
    revoked = users.revoke_token(person, request.user)
    return _done(request, person, f"{person.username}'s API token revoked." if revoked else f"{person.username} had no API token: nothing changed.")


def _unlock(request, person, form):
    removed = users.unlock(person, request.user)
    return _done(request, person, f"{person.username} unlocked." if removed else f"{person.username} was not locked out: nothing changed.")


ACTIONS = {"role": _set_role, "deactivate": _deactivate, "reactivate": _reactivate, "reset-password": _reset_password, "token": _token,
           "revoke-token": _revoke_token, "unlock": _unlock}

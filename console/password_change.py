"""A one-time password is for one sign-in: its user is sent to the password change page
until they choose their own. The flag lives on the user (``registry.actions.users``'
``must-change-password`` group); at sign-in it is copied into the session, so the check
on every request reads the session (loaded for `request.user` anyway) and costs no
query of its own."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import logout
from django.contrib.auth import views as auth_views
from django.contrib.auth.signals import user_logged_in
from django.dispatch import receiver
from django.http import JsonResponse
from django.shortcuts import redirect
from django.urls import reverse, reverse_lazy
from django.utils.deprecation import MiddlewareMixin

from console.user_forms import OwnPasswordForm
from registry.actions import users
from registry.db_unavailable import UNREACHABLE_ERRORS

SESSION_KEY = "must_change_password"
API_REFUSAL = ("this account signed in with a one-time password and must choose its own before anything else: "
               "change it at {page}, then call again")


@receiver(user_logged_in)
def remember_one_time_password(sender, request, user, **kwargs):
    if request is not None and hasattr(request, "session") and users.must_change_password(user):
        request.session[SESSION_KEY] = True


class PasswordChangeRequiredMiddleware(MiddlewareMixin):
    """Between the one-time sign-in and a new password, only that page and sign-out
    answer. MiddlewareMixin keeps it async-capable, like Django's own."""

    def process_request(self, request):
        if _required(request) and request.path not in (reverse("password-change"), reverse("logout")):
            if request.path.startswith("/api/"):  # the API answers JSON, never a redirect to a page
                return JsonResponse({"error": API_REFUSAL.format(page=reverse("password-change"))}, status=403)
            return redirect("password-change")
        return None


def _required(request) -> bool:
    session = getattr(request, "session", None)
    try:
        return bool(session is not None and session.get(SESSION_KEY))
    except UNREACHABLE_ERRORS:
        # Let the request go on: a page needing the database fails in its view, where
        # console.outage answers 503, and a 404 still renders without it.
        return False


class ChangePasswordView(auth_views.PasswordChangeView):
    form_class = OwnPasswordForm
    template_name = "registration/password_change.html"
    success_url = reverse_lazy("models")

    def get_form_kwargs(self):
        return {**super().get_form_kwargs(), "request": self.request}

    def form_invalid(self, form):
        if getattr(self.request, "axes_locked_out", False):
            logout(self.request)  # django-axes' middleware answers with its lockout page
        return super().form_invalid(form)

    def form_valid(self, form):
        response = super().form_valid(form)  # keeps this session signed in (update_session_auth_hash)
        users.password_changed(self.request.user)
        self.request.session.pop(SESSION_KEY, None)
        messages.success(self.request, "Password changed: sign in with it from now on.")
        return response

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), "required": bool(self.request.session.get(SESSION_KEY))}

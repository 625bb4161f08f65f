"""Web console pages."""

from __future__ import annotations

from django.http import JsonResponse
from django.shortcuts import render

from registry.api.errors import json_not_found, json_server_error


def not_found(request, exception=None):
    if request.path.startswith("/api/"):
        return json_not_found(request, exception)
    return render(request, "404.html", status=404)


def server_error(request):
    if request.path.startswith("/api/"):
        return json_server_error(request)
    return render(request, "500.html", status=500)


def healthz(request):
    return JsonResponse({"status": "ok"})

"""``GET /metrics`` of the console, for Prometheus: a few cheap aggregates read on scrape.

The workers export the traffic (serving/metrics.py); the console exports what only it
knows: the fleet as it sees it, each model's release, jobs and versions. Every figure is
one small query at scrape time (a collector, nothing kept in the process), so any console
process answers the same and a restart loses nothing.

Closed by default: with no ``CONSOLE_METRICS_TOKEN`` the route answers 404, as if it
did not exist; with one, only ``Authorization: Bearer <token>`` gets the figures (401
otherwise). The figures name models and count workers and jobs: not for the public."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.db.models import Count
from django.http import HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from registry.domain.choices import JobKind, JobStatus, VersionStatus
from registry.fleet.state import current_generation
from registry.fleet.workers import CONVERGENCE_STATES, IssuedDigests, convergence_state
from registry.models import Job, ModelVersion, RegisteredModel, Worker


class ConsoleCollector:
    """Gauges computed from the database on every scrape."""

    def collect(self):
        generation = current_generation()
        yield _gauge("modelops_console_generation", "Generation of the desired serving state.", [], [((), generation)])
        yield self._workers(generation)
        yield from self._releases()
        yield self._jobs()
        yield self._versions()

    def _workers(self, generation: int) -> GaugeMetricFamily:
        now, digests = timezone.now(), IssuedDigests()
        counts = dict.fromkeys(CONVERGENCE_STATES, 0)
        for worker in Worker.objects.only("last_seen_at", "ok", "generation", "last_report", "error"):
            counts[convergence_state(worker, generation, digests, now)] += 1
        return _gauge("modelops_console_workers", "Serving workers known to the console, by state.", ["state"],
                      [((state,), count) for state, count in counts.items()])

    def _releases(self):
        generations, canary_weights = [], []
        for model in RegisteredModel.objects.order_by("name"):
            release = model.current_release()
            if release is None:
                continue
            generations.append(((model.name,), release.generation))
            canary = sum(route["weight"] for route in release.routes if route["version"] != release.stable_version)
            canary_weights.append(((model.name,), canary))
        yield _gauge("modelops_console_model_generation", "Generation of each model's current release.", ["model"], generations)
        yield _gauge("modelops_console_canary_weight_percent", "Traffic share (%) routed to versions other than the stable one.",
                     ["model"], canary_weights)

    def _jobs(self) -> GaugeMetricFamily:
        counts = {(kind, status): 0 for kind in JobKind.values for status in JobStatus.values}
        for row in Job.objects.values("kind", "status").annotate(n=Count("id")).order_by():
            counts[(row["kind"], row["status"])] = row["n"]
        return _gauge("modelops_console_jobs", "Jobs by kind and status.", ["kind", "status"], list(counts.items()))

    def _versions(self) -> GaugeMetricFamily:
        counts = dict.fromkeys(VersionStatus.values, 0)
        for row in ModelVersion.objects.values("status").annotate(n=Count("id")).order_by():
            counts[row["status"]] = row["n"]
        return _gauge("modelops_console_versions", "Model versions by status.", ["status"], [((status,), n) for status, n in counts.items()])


def _gauge(name: str, documentation: str, labels: list[str], values) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=labels)
    for label_values, value in values:
        family.add_metric(list(label_values), value)
    return family


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(ConsoleCollector())


def _authorized(request, token: str) -> bool:
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), token.encode())


METRICS_OFF = ("the console's metrics are off: set CONSOLE_METRICS_TOKEN on the console and scrape /metrics with "
               "'Authorization: Bearer <that token>' (README, Settings); each worker serves its own at its /metrics\n")


@require_GET
def metrics_view(request):
    token = settings.CONSOLE_METRICS_TOKEN
    if not token:  # a 404 all the same (nothing is served here), but one that says how to turn it on
        return HttpResponse(METRICS_OFF, status=404, content_type="text/plain")
    if not _authorized(request, token):
        response = HttpResponse("a bearer token is needed\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    response = HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
    response["Cache-Control"] = "no-store"
    return response

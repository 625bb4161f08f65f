"""REST API for comparing a model's versions: every version's evaluation on every data
set, and each benchmarked version's throughput and p99 beside the stable version's."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.api.errors import error_responses
from registry.api.lookups import get_model
from registry.domain import version_metrics
from registry.domain.choices import VersionStatus


class Comparison(APIView):
    @extend_schema(
        responses={200: OpenApiTypes.OBJECT, **error_responses(404)},
        description=(
            "{stable_version, evaluation: {datasets: [{name, task, rows}], rows: [{version, status, is_stable, cells: "
            "{<data set>: {accuracy} | {mae, mse} | {status, error?}}}]}, benchmarks: [{version, sizes: [{batch_size, "
            "samples_per_s, stable_samples_per_s, change_pct, p99_ms, stable_p99_ms}]}]}: change_pct is the version's "
            "samples/s against the stable version's, in percent (positive: faster)."
        ),
    )
    def get(self, request, name: str):
        model = get_model(name)
        release = model.current_release()
        versions = list(model.versions.filter(status=VersionStatus.READY).order_by("-number"))
        stable = next((version for version in versions if release is not None and version.number == release.stable_version), None)
        benchmarks = [{"version": version.number, "sizes": version_metrics.benchmark_comparison(version, stable)}
                      for version in versions if stable is not None]
        return Response({
            "stable_version": None if stable is None else stable.number,
            "evaluation": version_metrics.evaluation_table(model),
            "benchmarks": benchmarks,
        })

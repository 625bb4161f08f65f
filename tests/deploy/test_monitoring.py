"""The monitoring files agree with what runs: the dashboard queries only metrics a real
worker or the console exports, Prometheus scrapes every worker replica and the console
where they listen, and the load balancer spreads requests over every replica."""

from __future__ import annotations

import json
import re

import httpx
import pytest
import yaml
from django.test import Client

from tests.deploy.consistency import (
    REPO_ROOT,
    metric_names,
    promql_metric_names,
    service_command,
)

COMPOSE_DIR = REPO_ROOT / "deploy" / "compose"
DASHBOARD = COMPOSE_DIR / "grafana" / "dashboards" / "modelops.json"
PROMETHEUS = COMPOSE_DIR / "prometheus" / "prometheus.yml"
NGINX = COMPOSE_DIR / "nginx.conf"
DOCKER_DNS = "127.0.0.11"
# Grafana's query of a template variable: label_values(SELECTOR, LABEL).
LABEL_VALUES = re.compile(r"^\s*label_values\((?P<selector>.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$")


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        match = LABEL_VALUES.match(query)
        expressions.append(match.group("selector") if match else query)
    return expressions


def worker_port(services) -> str:
    argv = " ".join(service_command(services["worker"])).split()
    return argv[argv.index("--port") + 1]


@pytest.fixture
def console_metrics(db, settings) -> str:
    settings.CONSOLE_METRICS_TOKEN = "token-for-the-deploy-checks-0123456789"
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.CONSOLE_METRICS_TOKEN}")
    assert response.status_code == 200
    return response.content.decode()


@pytest.fixture(scope="module")
def prometheus() -> dict:
    return yaml.safe_load(PROMETHEUS.read_text())


def scrape_job(prometheus: dict, name: str) -> dict:
    return next(job for job in prometheus["scrape_configs"] if job["job_name"] == name)


def test_the_dashboard_queries_only_metrics_a_worker_or_the_console_exports(worker_metrics, console_metrics):
    exported = metric_names(worker_metrics) | metric_names(console_metrics)
    queried = set().union(*(promql_metric_names(expression) for expression in dashboard_expressions()))

    assert queried, "the dashboard queries nothing"
    assert sorted(queried - exported) == []


@pytest.mark.parametrize("family", [
    "modelops_request_duration_seconds_bucket", "modelops_queue_duration_seconds_bucket", "modelops_compute_duration_seconds_bucket",
    "modelops_batch_size_bucket", "modelops_requests_total", "modelops_queue_depth", "modelops_device_memory_used_bytes",
    "modelops_state_generation", "modelops_pinned_requests_total", "modelops_client_deadline_refusals_total",
])
def test_the_dashboard_shows_each_serving_figure(family):
    assert any(family in promql_metric_names(expression) for expression in dashboard_expressions())


def test_the_dashboard_splits_errors_into_client_and_server_errors():
    expressions = dashboard_expressions()

    assert any('code=~"4.."' in expression for expression in expressions)
    assert any('code=~"5.."' in expression for expression in expressions)


def test_the_dashboard_shows_p50_p95_and_p99_latency():
    latency = [expression for expression in dashboard_expressions() if "modelops_request_duration_seconds_bucket" in expression]

    assert {quantile for expression in latency for quantile in re.findall(r"histogram_quantile\((0\.\d+)", expression)} >= {"0.5", "0.95", "0.99"}


def test_grafana_reads_the_dashboard_from_where_compose_mounts_it(services):
    provider = yaml.safe_load((COMPOSE_DIR / "grafana/provisioning/dashboards/modelops.yml").read_text())["providers"][0]
    mounts = dict(volume.rsplit(":", 1)[0].split(":", 1) for volume in services["grafana"]["volumes"] if volume.startswith("./"))

    assert mounts["./deploy/compose/grafana/dashboards"] == provider["options"]["path"]


def test_the_dashboard_uses_the_provisioned_prometheus_data_source():
    source = yaml.safe_load((COMPOSE_DIR / "grafana/provisioning/datasources/prometheus.yml").read_text())["datasources"][0]
    panels = json.loads(DASHBOARD.read_text())["panels"]

    assert source["url"] == "http://prometheus:9090"
    assert {panel["datasource"]["uid"] for panel in panels if "datasource" in panel} == {source["uid"]}


def test_prometheus_finds_every_worker_replica_by_docker_dns_on_the_worker_port(prometheus, services):
    workers = scrape_job(prometheus, "workers")
    discovery = workers["dns_sd_configs"][0]

    assert discovery["names"] == ["worker"] and discovery["type"] == "A"
    assert str(discovery["port"]) == worker_port(services)


def test_prometheus_scrapes_the_console_on_its_port_with_the_console_token(prometheus, services):
    console = scrape_job(prometheus, "console")
    argv = " ".join(service_command(services["console"])).split()

    assert console["static_configs"][0]["targets"] == [f"console:{argv[argv.index('--port') + 1]}"]
    assert console["metrics_path"] == "/metrics"
    assert console["authorization"]["credentials_file"] == "/run/secrets/console_metrics_token"


def test_prometheus_presents_the_worker_token_the_workers_require(prometheus, services):
    workers = scrape_job(prometheus, "workers")
    secrets = {name: spec["environment"] for name, spec in yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())["secrets"].items()}

    assert workers["authorization"]["credentials_file"] == "/run/secrets/worker_token"
    assert secrets == {"worker_token": "SERVING_WORKER_TOKEN", "console_metrics_token": "CONSOLE_METRICS_TOKEN"}
    assert set(services["prometheus"]["secrets"]) == set(secrets)
    assert services["worker"]["environment"]["SERVING_METRICS_TOKEN_REQUIRED"] == "true"


def test_the_worker_metrics_path_prometheus_scrapes_answers_on_a_real_worker(prometheus, deploy_worker):
    assert httpx.get(f"{deploy_worker.url}{scrape_job(prometheus, 'workers')['metrics_path']}", timeout=5).status_code == 200


def test_the_load_balancer_follows_every_worker_replica_through_docker_dns(services):
    config = NGINX.read_text()

    assert re.search(rf"^\s*resolver {re.escape(DOCKER_DNS)}\b", config, re.MULTILINE)
    assert re.search(rf"^\s*server worker:{worker_port(services)} resolve\b", config, re.MULTILINE)


def test_the_load_balancer_retries_another_worker_on_connection_errors_and_503():
    retry = re.search(r"^\s*proxy_next_upstream ([^;]+);", NGINX.read_text(), re.MULTILINE).group(1).split()

    assert {"error", "http_503", "non_idempotent"} <= set(retry)


def test_the_load_balancer_forwards_inference_and_keeps_the_operator_routes_inside():
    locations = re.findall(r"^\s*location (=\s*)?(\S+) \{\s*(\S+)", NGINX.read_text(), re.MULTILINE)
    proxied = {path for _, path, directive in locations if directive == "proxy_pass"}

    assert proxied == {"/v2/", "/predict"}


def test_the_load_balancer_listens_on_the_port_compose_publishes(services):
    published = {str(port).rsplit(":", 1)[1] for port in services["lb"]["ports"]}

    assert published == set(re.findall(r"^\s*listen (\d+);", NGINX.read_text(), re.MULTILINE))

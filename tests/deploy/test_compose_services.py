"""What docker-compose.yml runs exists in the project: every command, every setting it
passes, every port and probe path; and the workers get only what serving needs."""

from __future__ import annotations

import re

import httpx
import pytest
from django.urls import Resolver404, resolve

from tests.deploy.consistency import (
    command_problems,
    service_command,
    service_environment,
    settings_read,
    takes_console_http_options,
)

# Services that run this project's image, and those that run someone else's.
PROJECT_SERVICES = ("console", "demo", "celery", "jobs", "worker")
# Variables an official image reads itself, by service.
IMAGE_OWN_VARIABLES = {
    "postgres": re.compile(r"POSTGRES_(PASSWORD|USER|DB|INITDB_ARGS)$"),
    "redis": re.compile(r"REDISCLI_AUTH$"),
    "grafana": re.compile(r"GF_[A-Z0-9_]+$"),
}
DRAIN_MARGIN_S = 5


def project_services(services) -> dict[str, dict]:
    return {name: service for name, service in services.items() if "build" in service}


def healthcheck_argv(service: dict) -> list[str]:
    test = service["healthcheck"]["test"]
    if isinstance(test, str):
        return ["sh", "-c", test]
    kind, *rest = test
    return ["sh", "-c", rest[0]] if kind == "CMD-SHELL" else rest


def probed_url(service: dict) -> str:
    return re.search(r"https?://[^'\" ]+", " ".join(healthcheck_argv(service))).group(0)


def option(argv: list[str], name: str) -> str:
    words = " ".join(argv).split()
    return words[words.index(name) + 1]


def duration_s(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(number) * units[unit] for number, unit in re.findall(r"([0-9.]+)(ms|s|m|h)", text))


def test_every_service_of_the_project_runs_its_image(services):
    assert sorted(project_services(services)) == sorted(PROJECT_SERVICES)


@pytest.mark.parametrize("name", PROJECT_SERVICES)
def test_the_command_of_each_project_service_exists_in_the_project(services, name):
    assert command_problems(service_command(services[name])) == []


@pytest.mark.parametrize("name", ["console", "worker"])
def test_the_health_check_of_each_project_service_runs_in_the_project(services, name):
    assert command_problems(healthcheck_argv(services[name])) == []


@pytest.mark.parametrize("name", PROJECT_SERVICES)
def test_every_variable_a_project_service_sets_is_one_the_code_reads(services, name):
    unread = sorted(set(service_environment(services[name])) - settings_read())

    assert unread == [], f"{name} sets variables nothing reads: {unread}"


@pytest.mark.parametrize("name", sorted(IMAGE_OWN_VARIABLES))
def test_every_variable_another_image_gets_is_one_that_image_reads(services, name):
    unknown = sorted(variable for variable in service_environment(services[name]) if not IMAGE_OWN_VARIABLES[name].match(variable))

    assert unknown == []


def test_the_celery_workers_consume_the_control_and_the_jobs_queue_between_them(services, settings):
    consumed = {option(service_command(services[name]), "--queues") for name in ("celery", "jobs")}

    assert consumed == {"celery", settings.JOBS_QUEUE}
    assert "--beat" in service_command(services["celery"]) and "--beat" not in service_command(services["jobs"])


def test_workers_get_only_the_console_url_their_token_and_redis(services):
    worker = services["worker"]
    environment = service_environment(worker)

    assert {"CONSOLE_URL", "SERVING_WORKER_TOKEN", "REDIS_URL"} <= set(environment)
    assert not {"DATABASE_URL", "DJANGO_SECRET_KEY", "CONSOLE_METRICS_TOKEN"} & set(environment)
    assert not worker.get("volumes") and not worker.get("ports")
    assert environment["CONSOLE_URL"] == "http://console:8000"


def test_workers_share_no_network_with_the_database(services):
    assert not set(services["worker"]["networks"]) & set(services["postgres"]["networks"])


def test_the_console_and_the_workers_use_the_same_worker_token_and_redis(services):
    console, worker = service_environment(services["console"]), service_environment(services["worker"])

    assert console["SERVING_WORKER_TOKEN"] == worker["SERVING_WORKER_TOKEN"]
    assert console["REDIS_URL"] == worker["REDIS_URL"]


def test_redis_requires_the_password_the_services_connect_with(services):
    command = services["redis"]["command"]
    password = command[command.index("--requirepass") + 1]

    assert password and f"redis://:{password}@redis:6379/" in service_environment(services["console"])["REDIS_URL"]


def test_the_workers_run_two_replicas_unless_told_otherwise(services):
    assert int(services["worker"]["deploy"]["replicas"]) == 2


def test_a_stopping_worker_has_time_to_drain_before_it_is_killed(services):
    worker = services["worker"]
    environment = service_environment(worker)
    drain_s = float(environment["SERVING_DRAIN_DELAY_S"]) + float(environment["SERVING_DRAIN_TIMEOUT_S"])

    assert duration_s(worker["stop_grace_period"]) >= drain_s + DRAIN_MARGIN_S


def test_the_worker_health_check_probes_the_port_it_serves_on(services):
    worker = services["worker"]

    assert f":{option(service_command(worker), '--port')}/" in probed_url(worker)


def test_the_worker_health_check_path_answers_on_a_real_worker(services, deploy_worker):
    path = "/" + probed_url(services["worker"]).split("/", 3)[3]

    assert httpx.get(f"{deploy_worker.url}{path}", timeout=5).status_code == 200


def test_the_console_health_check_probes_a_console_route_on_its_port(services):
    console = services["console"]
    url = probed_url(console)

    assert f":{option(service_command(console), '--port')}/" in url
    assert resolve("/" + url.split("/", 3)[3]).url_name == "healthz"


def test_the_console_takes_the_http_options_make_run_gives_it(services):
    argv = service_command(services["console"])
    assert takes_console_http_options(argv), argv


def test_the_consoles_metrics_route_exists():
    try:
        match = resolve("/metrics")
    except Resolver404:
        pytest.fail("the console has no /metrics route")
    assert match.url_name == "metrics"


def test_the_console_answers_the_workers_and_the_prometheus_host_name(services):
    allowed = service_environment(services["console"])["ALLOWED_HOSTS"].split(",")

    assert "console" in allowed and "*" not in allowed


def test_published_ports_are_on_loopback_unless_told_otherwise(services):
    published = [port for service in services.values() for port in service.get("ports", [])]

    assert published and all(str(port).startswith("127.0.0.1:") for port in published)


@pytest.mark.parametrize("name", PROJECT_SERVICES)
def test_project_services_drop_every_capability(services, name):
    assert services[name]["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in services[name]["security_opt"]


def test_images_of_other_projects_are_pinned_to_an_exact_version(services):
    unpinned = [f"{name}: {service['image']}" for name, service in services.items() if "build" not in service
                and not re.fullmatch(r"[a-z0-9./-]+:v?[0-9]+\.[0-9]+(\.[0-9]+)?(-[a-z0-9.]+)?", service["image"])]

    assert unpinned == []


@pytest.mark.parametrize("name", [name for name in PROJECT_SERVICES if name != "console"])
def test_project_services_other_than_the_console_replace_the_images_console_probe(services, name):
    healthcheck = services[name].get("healthcheck", {})

    assert healthcheck.get("disable") or "8000/healthz" not in " ".join(healthcheck_argv(services[name]))


def test_every_service_waited_for_as_healthy_has_a_health_check(services):
    awaited = {dependency for service in services.values() for dependency, spec in (service.get("depends_on") or {}).items()
               if isinstance(spec, dict) and spec.get("condition") == "service_healthy"}

    unprobed = sorted(name for name in awaited if not services[name].get("healthcheck", {}).get("test"))
    assert unprobed == []

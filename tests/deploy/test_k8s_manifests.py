"""The Kubernetes manifests (deploy/k8s) are valid objects and name only what the code
has: commands, settings, ports, probe paths, metrics. No cluster runs here: every file
and every overlay's kustomize render is validated against the Kubernetes schemas (strict:
an unknown field is an error), then compared with the project itself."""

from __future__ import annotations

import copy
from urllib.parse import urlparse

import httpx
import kubernetes_validate
import pytest
import yaml
from django.urls import resolve

from console import views
from tests.console.test_outage import unreachable_database
from tests.deploy import k8s_checks as k8s
from tests.deploy.consistency import (
    command_problems,
    metric_names,
    promql_metric_names,
    settings_read,
    takes_console_http_options,
)

KUBERNETES_VERSION = "1.33.0"
# The image's user (Dockerfile): pods run as it, never as root.
IMAGE_UID = 10001
# What the kubelet needs after the drain, to close the control plane and exit.
SHUTDOWN_MARGIN_S = 5
# The keys of the Secret the user creates (README "Many hosts: Kubernetes").
SECRET_KEYS = {"DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY", "SERVING_WORKER_TOKEN", "CONSOLE_METRICS_TOKEN"}  # the last optional
DEMO_SECRET_KEYS = SECRET_KEYS | {"POSTGRES_PASSWORD", "REDIS_PASSWORD"}
WORKER_SECRETS = {"SERVING_WORKER_TOKEN", "REDIS_URL"}

ALL_RENDERS = [*k8s.OVERLAYS, "prometheus-adapter"]


def _render(name: str):
    return k8s.render(k8s.ADAPTER_DIR) if name == "prometheus-adapter" else k8s.overlay(name)


def _relative(path) -> str:
    return str(path.relative_to(k8s.REPO_ROOT))


# ---------------------------------------------------------------- schemas


@pytest.mark.parametrize("path", k8s.object_files(), ids=_relative)
def test_every_manifest_file_holds_valid_kubernetes_objects(path):
    objects = k8s.documents(path)

    assert objects, f"{_relative(path)} holds no object"
    for item in objects:
        kubernetes_validate.validate(item, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("name", ALL_RENDERS)
def test_every_overlay_renders_to_valid_kubernetes_objects(name):
    for item in _render(name):
        kubernetes_validate.validate(item, KUBERNETES_VERSION, strict=True)


def test_strict_validation_refuses_a_misspelt_field():
    deployment = copy.deepcopy(k8s.named(k8s.overlay("cpu"), "Deployment", "modelops-worker"))
    deployment["spec"]["replica"] = 3

    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_every_yaml_file_is_used_by_a_kustomization_or_checked_as_another_format():
    referenced = k8s.referenced_files() | {path.resolve() for path in k8s.NOT_OBJECTS}
    roots = {(k8s.K8S_ROOT / "overlays" / name / "kustomization.yaml").resolve() for name in k8s.OVERLAYS}
    roots.add((k8s.ADAPTER_DIR / "kustomization.yaml").resolve())

    unused = [_relative(path) for path in k8s.yaml_files() if path.resolve() not in referenced | roots]
    assert unused == []


@pytest.mark.parametrize("name", ALL_RENDERS)
def test_no_secret_is_committed(name):
    assert k8s.of_kind(_render(name), "Secret") == []


# ---------------------------------------------------------------- commands and settings


@pytest.mark.parametrize("name", k8s.OVERLAYS)
def test_every_command_our_containers_run_exists_in_the_project(name):
    problems = {container.name: command_problems(container.argv) for container in k8s.our_containers(k8s.overlay(name))}

    assert {name: found for name, found in problems.items() if found} == {}


@pytest.mark.parametrize("name", k8s.OVERLAYS)
def test_every_variable_our_containers_get_is_one_the_code_reads(name):
    objects = k8s.overlay(name)
    read = settings_read()

    unread = {container.name: sorted(set(k8s.environment(objects, container)) - read - k8s.expanded_names(container))
              for container in k8s.our_containers(objects)}
    assert {name: names for name, names in unread.items() if names} == {}


@pytest.mark.parametrize(("name", "documented"), [("cpu", SECRET_KEYS), ("gpu", SECRET_KEYS), ("demo", DEMO_SECRET_KEYS)])
def test_the_secret_keys_used_are_the_documented_ones_each_under_its_own_name(name, documented):
    objects = k8s.overlay(name)
    used = {}
    for container in k8s.containers(objects):
        used.update(k8s.secret_keys(container))

    assert set(used.values()) == documented
    assert all(variable == key for variable, key in used.items())
    assert {key for container in k8s.our_containers(objects) for key in k8s.secret_keys(container).values()} <= settings_read()


@pytest.mark.parametrize("name", k8s.OVERLAYS)
def test_the_console_takes_its_metrics_token_from_the_secret_when_it_has_one(name):
    """README: scrape the console's /metrics with CONSOLE_METRICS_TOKEN. Without it in the
    console's environment /metrics answers 404 whatever the Secret holds; optional, so a
    Secret of the four keys still starts the console."""
    objects = k8s.overlay(name)
    console = k8s.the_container(objects, "console")
    tokens = [entry for entry in console.spec.get("env", []) if entry["name"] == "CONSOLE_METRICS_TOKEN"]

    assert [entry["valueFrom"]["secretKeyRef"] for entry in tokens] == [
        {"name": "modelops-secrets", "key": "CONSOLE_METRICS_TOKEN", "optional": True}]
    holders = [container.spec["name"] for container in k8s.containers(objects) if "CONSOLE_METRICS_TOKEN" in k8s.secret_keys(container)]
    assert holders == ["console"]  # no migration, Celery or worker container is given it


@pytest.mark.parametrize("name", k8s.OVERLAYS)
def test_workers_get_only_the_console_url_their_token_and_redis(name):
    objects = k8s.overlay(name)
    worker = k8s.the_container(objects, "worker")

    assert set(k8s.secret_keys(worker).values()) == WORKER_SECRETS
    assert "CONSOLE_URL" in k8s.environment(objects, worker)
    assert all("persistentVolumeClaim" not in volume for volume in k8s.pod_spec(worker.workload)["volumes"])


@pytest.mark.parametrize("name", k8s.OVERLAYS)
def test_console_and_celery_share_the_data_volume_at_data_dir(name):
    objects = k8s.overlay(name)

    for component in ("console", "control", "jobs"):
        container = k8s.the_container(objects, component)
        data_dir = k8s.environment(objects, container)["DATA_DIR"]
        mounts = {mount["mountPath"]: mount["name"] for mount in container.spec["volumeMounts"]}
        volumes = {volume["name"]: volume for volume in k8s.pod_spec(container.workload)["volumes"]}
        assert volumes[mounts[data_dir]]["persistentVolumeClaim"]["claimName"] == "modelops-data", component


GI = 1024**3


def quantity_bytes(quantity: str) -> int:
    number, unit = (quantity[:-2], quantity[-2:]) if quantity.endswith(("Ki", "Mi", "Gi", "Ti")) else (quantity, "")
    return int(float(number) * {"": 1, "Ki": 1024, "Mi": 1024**2, "Gi": GI, "Ti": 1024**4}[unit])


@pytest.mark.parametrize("name", k8s.OVERLAYS)
def test_the_console_s_tmp_holds_two_uploads_of_the_largest_size(name, settings):
    # Django's ASGI handler spools a whole request body into TMPDIR before the view stages
    # it on the data volume: a 1 Gi /tmp had the kubelet evict the console mid-upload of a
    # 2 GiB model (MAX_UPLOAD_BYTES).
    objects = k8s.overlay(name)
    console = k8s.the_container(objects, "console")
    largest = int(k8s.environment(objects, console).get("MAX_UPLOAD_BYTES") or settings.MAX_UPLOAD_BYTES)
    mounts = {mount["mountPath"]: mount["name"] for mount in console.spec["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in k8s.pod_spec(console.workload)["volumes"]}

    assert quantity_bytes(volumes[mounts["/tmp"]]["emptyDir"]["sizeLimit"]) >= 2 * largest


@pytest.mark.parametrize("name", k8s.OVERLAYS)
def test_workers_reach_the_console_through_its_service(name):
    objects = k8s.overlay(name)
    console_url = urlparse(k8s.environment(objects, k8s.the_container(objects, "worker"))["CONSOLE_URL"])
    service = k8s.named(objects, "Service", console_url.hostname)
    console = k8s.the_container(objects, "console")
    allowed_hosts = k8s.environment(objects, console)["ALLOWED_HOSTS"].split(",")

    assert console_url.port in [port["port"] for port in service["spec"]["ports"]]
    assert k8s.selects(service["spec"]["selector"], k8s.pod_labels(console.workload))
    assert console_url.hostname in allowed_hosts


# ---------------------------------------------------------------- ports and probes


def _service_target_ports(objects, workload: dict, container: k8s.Container) -> list[int]:
    services = [service for service in k8s.of_kind(objects, "Service")
                if k8s.selects(service["spec"]["selector"], k8s.pod_labels(workload))]
    assert services, f"no Service selects {workload['metadata']['name']}"
    return [k8s.container_port(container, port.get("targetPort", port["port"])) for service in services
            for port in service["spec"]["ports"]]


def _probe_ports(container: k8s.Container) -> list[int]:
    return [k8s.container_port(container, container.spec[probe]["httpGet"]["port"])
            for probe in ("readinessProbe", "livenessProbe")]


@pytest.mark.parametrize("name", k8s.OVERLAYS)
def test_the_worker_port_agrees_in_command_container_service_probes_and_scrape(name):
    objects = k8s.overlay(name)
    worker = k8s.the_container(objects, "worker")
    port = int(k8s.option(worker.argv, "--port"))
    annotations = worker.workload["spec"]["template"]["metadata"]["annotations"]

    assert [entry["containerPort"] for entry in worker.spec["ports"]] == [port]
    assert urlparse(k8s.option(worker.argv, "--public-url")).port == port
    assert _service_target_ports(objects, worker.workload, worker) == [port]
    assert _probe_ports(worker) == [port, port]
    assert int(annotations["prometheus.io/port"]) == port


@pytest.mark.parametrize("name", k8s.OVERLAYS)
def test_the_console_port_agrees_in_command_container_service_and_probes(name):
    objects = k8s.overlay(name)
    console = k8s.the_container(objects, "console")
    port = int(k8s.option(console.argv, "--port"))

    assert [entry["containerPort"] for entry in console.spec["ports"]] == [port]
    assert _service_target_ports(objects, console.workload, console) == [port]
    assert _probe_ports(console) == [port, port]


@pytest.mark.parametrize("name", k8s.OVERLAYS)
def test_the_console_takes_the_http_options_make_run_gives_it(name):
    argv = k8s.the_container(k8s.overlay(name), "console").argv
    assert takes_console_http_options(argv), argv


def test_the_worker_probe_and_scrape_paths_answer_on_a_ready_worker(deploy_worker):
    worker = k8s.the_container(k8s.overlay("cpu"), "worker")
    annotations = worker.workload["spec"]["template"]["metadata"]["annotations"]
    paths = {probe: worker.spec[probe]["httpGet"]["path"] for probe in ("readinessProbe", "livenessProbe")}

    assert paths == {"readinessProbe": "/v2/health/ready", "livenessProbe": "/v2/health/live"}
    for path in [*paths.values(), annotations["prometheus.io/path"]]:
        assert httpx.get(f"{deploy_worker.url}{path}", timeout=5).status_code == 200, path


CONSOLE_PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def console_probe_answers(client, settings) -> dict[str, int]:
    """Each console probe's status, sent as the kubelet sends it (path and Host header)."""
    objects = k8s.overlay("cpu")
    console = k8s.the_container(objects, "console")
    settings.ALLOWED_HOSTS = k8s.environment(objects, console)["ALLOWED_HOSTS"].split(",")
    answers = {}
    for name in CONSOLE_PROBES:
        probe = console.spec[name]["httpGet"]
        headers = {header["name"]: header["value"] for header in probe["httpHeaders"]}
        answers[name] = client.get(probe["path"], HTTP_HOST=headers["Host"]).status_code
    return answers


@pytest.mark.django_db
def test_the_console_probes_pass_on_a_console_that_reaches_its_database_and_redis(client, settings):
    assert console_probe_answers(client, settings) == dict.fromkeys(CONSOLE_PROBES, 200)


@pytest.mark.django_db(transaction=True)  # the outage closes and reopens the connection
def test_a_database_outage_keeps_a_started_console_in_its_service_but_holds_back_a_new_one(client, settings):
    with unreachable_database():
        answers = console_probe_answers(client, settings)

    # Every replica shares the outage: out of the Service, none could answer its 503 with
    # Retry-After. A pod that never reached the database is not started (a rollout stalls).
    assert answers == {"startupProbe": 503, "readinessProbe": 200, "livenessProbe": 200}


def test_the_console_probes_are_its_health_views():
    console = k8s.the_container(k8s.overlay("cpu"), "console")
    views_by_probe = {name: resolve(console.spec[name]["httpGet"]["path"]).func for name in CONSOLE_PROBES}

    assert views_by_probe == {"startupProbe": views.readyz, "readinessProbe": views.healthz, "livenessProbe": views.healthz}


# ---------------------------------------------------------------- graceful stop


@pytest.mark.parametrize("name", k8s.OVERLAYS)
def test_the_worker_grace_period_outlasts_its_drain(name):
    objects = k8s.overlay(name)
    worker = k8s.the_container(objects, "worker")
    variables = k8s.environment(objects, worker)
    drain_s = float(variables["SERVING_DRAIN_DELAY_S"]) + float(variables["SERVING_DRAIN_TIMEOUT_S"])

    assert float(variables["SERVING_DRAIN_DELAY_S"]) == 5
    assert k8s.pod_spec(worker.workload)["terminationGracePeriodSeconds"] >= drain_s + SHUTDOWN_MARGIN_S


@pytest.mark.parametrize("name", k8s.OVERLAYS)
def test_the_worker_readiness_probe_notices_the_drain_within_its_delay(name):
    objects = k8s.overlay(name)
    worker = k8s.the_container(objects, "worker")
    probe = worker.spec["readinessProbe"]

    assert probe["periodSeconds"] * probe.get("failureThreshold", 3) < float(k8s.environment(objects, worker)["SERVING_DRAIN_DELAY_S"])


# ---------------------------------------------------------------- autoscaling


def test_the_autoscaler_metric_is_the_one_the_adapter_serves():
    hpa = k8s.named(k8s.overlay("cpu"), "HorizontalPodAutoscaler", "modelops-worker")
    served = {k8s.exported_name(rule) for rule in k8s.adapter_rules()}

    assert [metric["type"] for metric in hpa["spec"]["metrics"]] == ["Pods"]
    assert {metric["pods"]["metric"]["name"] for metric in hpa["spec"]["metrics"]} <= served
    assert hpa["spec"]["scaleTargetRef"]["name"] == k8s.workload_by_component(k8s.overlay("cpu"), "worker")["metadata"]["name"]


def test_every_metric_the_adapter_queries_is_one_a_running_worker_exports(worker_metrics):
    exported = metric_names(worker_metrics)

    for rule in k8s.adapter_rules():
        queried = set().union(*(promql_metric_names(query) for query in k8s.rule_queries(rule)))
        assert queried, rule
        assert queried <= exported, f"not exported by a worker: {sorted(queried - exported)}"


def test_the_helm_values_carry_the_same_adapter_rule():
    values = yaml.safe_load((k8s.ADAPTER_DIR / "helm-values.yaml").read_text())

    assert values["rules"]["custom"] == k8s.adapter_rules()
    assert values["rules"]["default"] is False


def test_the_autoscaler_scales_up_at_once_and_down_slowly():
    behavior = k8s.named(k8s.overlay("cpu"), "HorizontalPodAutoscaler", "modelops-worker")["spec"]["behavior"]

    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300
    most_up = max(policy["value"] for policy in behavior["scaleUp"]["policies"] if policy["type"] == "Pods")
    most_down = max(policy["value"] for policy in behavior["scaleDown"]["policies"] if policy["type"] == "Pods")
    assert most_up > most_down


# ---------------------------------------------------------------- devices


def test_the_gpu_overlay_gives_each_worker_a_gpu_on_the_cuda_image():
    objects = k8s.overlay("gpu")
    worker = k8s.the_container(objects, "worker")
    tolerations = k8s.pod_spec(worker.workload).get("tolerations", [])

    assert worker.spec["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "cuda" in worker.spec["image"].rsplit(":", 1)[1]
    assert k8s.environment(objects, worker)["SERVING_DEVICE"] == "cuda"
    assert any(toleration["key"] == "nvidia.com/gpu" for toleration in tolerations)


def test_only_workers_take_the_cuda_image():
    others = [container for container in k8s.our_containers(k8s.overlay("gpu")) if container.name != "modelops-worker/worker"]

    assert others and all("cuda" not in container.spec["image"] for container in others)


@pytest.mark.parametrize("name", ["cpu", "demo"])
def test_the_cpu_overlays_never_try_cuda(name):
    objects = k8s.overlay(name)
    worker = k8s.the_container(objects, "worker")

    assert k8s.environment(objects, worker)["SERVING_DEVICE"] == "cpu"
    assert all("cuda" not in container.spec["image"] for container in k8s.our_containers(objects))
    assert "nvidia.com/gpu" not in worker.spec["resources"]["limits"]


# ---------------------------------------------------------------- selectors and singletons


@pytest.mark.parametrize("name", k8s.OVERLAYS)
def test_the_disruption_budget_selects_exactly_the_worker_pods(name):
    objects = k8s.overlay(name)
    (budget,) = k8s.of_kind(objects, "PodDisruptionBudget")
    selected = [workload["metadata"]["name"] for workload in objects if workload["kind"] in k8s.WORKLOADS
                and k8s.selects(budget["spec"]["selector"]["matchLabels"], k8s.pod_labels(workload))]

    assert selected == [k8s.workload_by_component(objects, "worker")["metadata"]["name"]]


@pytest.mark.parametrize("name", k8s.OVERLAYS)
def test_every_service_selects_the_pods_of_exactly_one_workload(name):
    objects = k8s.overlay(name)

    for service in k8s.of_kind(objects, "Service"):
        selected = [workload for workload in objects if workload["kind"] in k8s.WORKLOADS
                    and k8s.selects(service["spec"]["selector"], k8s.pod_labels(workload))]
        assert len(selected) == 1, service["metadata"]["name"]


@pytest.mark.parametrize("name", k8s.OVERLAYS)
def test_every_workload_selector_matches_its_own_pods(name):
    for workload in k8s.overlay(name):
        if workload["kind"] in k8s.WORKLOADS:
            assert k8s.selects(workload["spec"]["selector"]["matchLabels"], k8s.pod_labels(workload))


@pytest.mark.parametrize("name", k8s.OVERLAYS)
def test_beat_runs_in_one_pod_that_is_never_doubled_by_a_rollout(name):
    objects = k8s.overlay(name)
    with_beat = [container for container in k8s.our_containers(objects) if "--beat" in container.argv or "beat" in container.argv[:4]]

    assert [container.name for container in with_beat] == ["modelops-celery-control/control"]
    workload = with_beat[0].workload
    assert workload["spec"]["replicas"] == 1
    assert workload["spec"]["strategy"] == {"type": "Recreate"}


@pytest.mark.parametrize("name", k8s.OVERLAYS)
def test_both_celery_queues_have_a_consumer(name):
    consumed = {k8s.option(container.argv, "--queues") for container in k8s.our_containers(k8s.overlay(name))
                if container.argv[:1] == ["celery"]}

    assert consumed == {"celery", "jobs"}


# ---------------------------------------------------------------- hardening


@pytest.mark.parametrize("name", k8s.OVERLAYS)
def test_our_pods_run_as_the_image_user_with_nothing_to_spare(name):
    for container in k8s.our_containers(k8s.overlay(name)):
        pod = k8s.pod_spec(container.workload)
        security = container.spec["securityContext"]
        assert pod["automountServiceAccountToken"] is False, container.name
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == IMAGE_UID
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert security == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}}, container.name


@pytest.mark.parametrize("name", k8s.OVERLAYS)
def test_every_writable_path_of_our_containers_is_a_mounted_volume(name):
    objects = k8s.overlay(name)

    for container in k8s.our_containers(objects):
        mounts = {mount["mountPath"] for mount in container.spec["volumeMounts"]}
        assert {"/tmp", k8s.environment(objects, container)["DATA_DIR"]} <= mounts, container.name


@pytest.mark.parametrize("name", k8s.OVERLAYS)
def test_every_container_has_resource_requests_and_limits(name):
    for container in k8s.containers(k8s.overlay(name)):
        resources = container.spec["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]) & set(resources["limits"]), container.name

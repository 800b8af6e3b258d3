"""Helpers for the manifest tests: render a kustomization, index its objects, resolve
container environment values and the objects a pod template refers to."""

from __future__ import annotations

import base64
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
OVERLAYS = ("dev", "prod")

#: Secrets the prod overlay expects to exist in the namespace (docs/deploy.md);
#: optional references (huggingface-token) are allowed to be missing anywhere.
EXTERNAL_SECRETS = {
    "base": {"taskplane-database", "taskplane-gateway-secrets"},
    "dev": set(),
    "prod": {"taskplane-database", "taskplane-gateway-secrets"},
}

WORKLOAD_KINDS = ("Deployment", "Job")


def kubectl() -> str | None:
    return shutil.which("kubectl")


def kustomize(path: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize PATH`` (kustomize built into kubectl), parsed."""
    exe = kubectl()
    assert exe is not None
    proc = subprocess.run([exe, "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise AssertionError(f"kubectl kustomize {path} failed:\n{proc.stderr}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


class Rendered:
    """The objects of one rendered overlay, by kind and name."""

    def __init__(self, name: str, objects: list[dict[str, Any]]) -> None:
        self.name = name
        self.objects = objects

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        for o in self.objects:
            if o["kind"] == kind and o["metadata"]["name"] == name:
                return o
        return None

    def by_prefix(self, kind: str, prefix: str) -> dict[str, Any]:
        """A generated ConfigMap/Secret, whose name carries kustomize's hash suffix."""
        hits = [o for o in self.of_kind(kind) if o["metadata"]["name"] == prefix
                or o["metadata"]["name"].rsplit("-", 1)[0] == prefix]
        assert len(hits) == 1, f"{self.name}: expected one {kind} {prefix}, found {len(hits)}"
        return hits[0]

    def workloads(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """(object, pod template) for every Deployment and Job."""
        for o in self.objects:
            if o["kind"] in WORKLOAD_KINDS:
                yield o, o["spec"]["template"]

    def data(self, kind: str, name: str) -> dict[str, str] | None:
        """Decoded data of a ConfigMap or Secret, or None when it is not rendered."""
        obj = self.get(kind, name)
        if obj is None:
            return None
        if kind == "Secret":
            out = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
            out.update(obj.get("stringData") or {})
            return out
        return dict(obj.get("data") or {})

    def env(self, container: dict[str, Any], name: str) -> str | None:
        """A container's environment value, following configMapKeyRef/secretKeyRef."""
        for e in container.get("env") or []:
            if e["name"] != name:
                continue
            if "value" in e:
                return str(e["value"])
            src = e.get("valueFrom") or {}
            for ref, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
                if ref in src:
                    data = self.data(kind, src[ref]["name"])
                    return None if data is None else data.get(src[ref]["key"])
        return None


def containers(template: dict[str, Any], *, init: bool = True) -> list[dict[str, Any]]:
    spec = template["spec"]
    return list(spec.get("containers") or []) + (list(spec.get("initContainers") or []) if init else [])


def container(template: dict[str, Any], name: str) -> dict[str, Any]:
    for c in containers(template):
        if c["name"] == name:
            return c
    raise AssertionError(f"no container {name}")


def arg_value(args: list[str], flag: str) -> str | None:
    """The value of ``--flag=value`` or ``--flag value`` in an argument list."""
    for i, a in enumerate(args):
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
        if a == flag and i + 1 < len(args):
            return args[i + 1]
    return None


def named_ports(c: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: int(p["containerPort"]) for p in c.get("ports") or [] if p.get("name")}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())

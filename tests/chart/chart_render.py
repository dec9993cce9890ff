"""Rendering helpers: the chart through the real Helm engine (helm-python-sdk bundles it; no helm binary)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "koordqos"
RELEASE = "koordqos"
NAMESPACE = "koordqos-system"
# The Kubernetes version manifests are validated against, and the oldest one the chart claims (kubeVersion).
KUBE_VERSION = "1.31.0"
KUBE_MIN_VERSION = "1.25.0"

# A set that flips every switch away from its default, so each template branch renders.
NON_DEFAULT_VALUES: dict[str, Any] = {
    "image": {"repository": "registry.example/koordqos", "tag": "0.1.0-rc1", "pullPolicy": "Always"},
    "agent": {
        "dryRun": True,
        "featureGates": {"CPUBurst": False, "BECPUEvict": True, "BEMemoryEvict": True},
        "logFormat": "console",
        "logLevel": "debug",
        "runtimeHooksFailurePolicy": "Fail",
        "debugEndpoints": True,
        "shutdownTimeoutSeconds": 8,
        "nri": {"pluginName": "koordqos-test", "pluginIndex": 7},
        "runtimeHooksProxy": {"enabled": True},
        "extraArgs": ["--eviction-qps=2"],
        "extraEnv": [{"name": "KOORDQOS_COLLECT_INTERVAL", "value": "2"}],
    },
    "hostPaths": {"cgroupRoot": "/sys/fs/cgroup", "procReadOnly": True},
    "resctrl": {"enabled": True},
    "http": {"port": 19316},
    "hostNetwork": True,
    "securityContext": {
        "capabilities": {"drop": ["ALL"], "add": ["SYS_PTRACE"]},
        "seLinuxOptions": {"type": "spc_t"},
        "appArmorProfile": {"type": "Unconfined"},
    },
    "serviceAccount": {"create": False, "name": "custom-sa"},
    "crds": {"install": False},
    "metrics": {
        "service": {"enabled": True},
        "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prometheus"}},
        "grafanaDashboard": {"enabled": True, "namespace": "monitoring"},
        "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
    },
    "podLabels": {"team": "platform"},
}


@dataclass
class Rendered:
    """One rendering of the chart: every manifest as a dict, in template order."""

    manifests: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        """All manifests of `kind`."""
        return [m for m in self.manifests if m["kind"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        """The single manifest of `kind` (fails if there is not exactly one)."""
        found = self.of_kind(kind)
        assert len(found) == 1, f"expected one {kind}, got {len(found)}"
        return found[0]

    @property
    def daemonset(self) -> dict[str, Any]:
        """The agent DaemonSet."""
        return self.one("DaemonSet")

    @property
    def pod_spec(self) -> dict[str, Any]:
        """The DaemonSet's pod spec."""
        spec: dict[str, Any] = self.daemonset["spec"]["template"]["spec"]
        return spec

    @property
    def container(self) -> dict[str, Any]:
        """The agent container."""
        containers = self.pod_spec["containers"]
        assert len(containers) == 1
        container: dict[str, Any] = containers[0]
        return container


def render(chart: helm.Chart, values: dict[str, Any] | None = None) -> Rendered:
    """Render with the Helm engine (schema-checked like `helm template`) and parse every manifest."""
    out = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    manifests: list[dict[str, Any]] = []
    for path in sorted(out):
        if path.endswith("NOTES.txt"):
            continue
        manifests.extend(doc for doc in yaml.safe_load_all(out[path]) if doc)
    return Rendered(manifests)

"""crictl against the private containerd, and pods as the kubelet would describe them to the CRI."""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from koordqos.testing.poll import wait_until_sync

from .prereq import POLL


@dataclass
class CRI:
    """crictl against the private containerd."""

    crictl: str
    address: Path
    workdir: Path
    _n: int = 0

    def _cmd(self, *args: str) -> list[str]:
        ep = f"unix://{self.address}"
        return [self.crictl, "--runtime-endpoint", ep, "--image-endpoint", ep, "--timeout", "30s", *args]

    def ok(self, *args: str) -> bool:
        proc = subprocess.run(self._cmd(*args), capture_output=True, timeout=60, check=False)
        return proc.returncode == 0

    def run(self, *args: str, timeout: float = 90.0) -> str:
        proc = subprocess.run(self._cmd(*args), capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise AssertionError(f"crictl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout.strip()

    def _write(self, doc: dict[str, Any]) -> str:
        self._n += 1
        path = self.workdir / f"cri-{self._n}.json"
        path.write_text(json.dumps(doc))
        return str(path)

    def run_pod(self, pod: PodSpec) -> str:
        """RunPodSandbox; the sandbox id."""
        pod.config_path = self._write(pod.config(self.workdir / "logs"))
        pod.id = self.run("runp", pod.config_path)
        return pod.id

    def create(self, pod: PodSpec, name: str, command: list[str], **resources: int) -> str:
        """CreateContainer (not started); the container id."""
        cfg = {
            "metadata": {"name": name},
            "image": {"image": WORKLOAD_IMAGE},
            "command": command,
            "log_path": f"{name}.log",
            "linux": {"resources": resources},
        }
        cid = self.run("create", pod.id, self._write(cfg), pod.config_path)
        pod.containers[name] = cid
        return cid

    def start(self, cid: str) -> None:
        self.run("start", cid)

    def run_container(self, pod: PodSpec, name: str, command: list[str], **resources: int) -> str:
        """Create and start; waits until the container runs; its id."""
        cid = self.create(pod, name, command, **resources)
        self.start(cid)
        wait_until_sync(
            lambda: self.inspect(cid)["status"]["state"] == "CONTAINER_RUNNING", 30, POLL, f"{name} running"
        )
        return cid

    def inspect(self, cid: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.run("inspect", "-o", "json", cid))
        return doc

    def pid(self, cid: str) -> int:
        return int(self.inspect(cid)["info"]["pid"])

    def update(self, cid: str, *args: str) -> None:
        self.run("update", *args, cid)

    def remove_all(self) -> None:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            self.run("rmp", "--force", "--all")


WORKLOAD_IMAGE = "localhost/koordqos-e2e/busybox:1"
SLEEP = ["/bin/sleep", "100000"]
BURN = ["/bin/sh", "-c", "while :; do :; done"]
# What the kubelet asks for a BestEffort container: the minimum shares, no quota, no memory limit.
BE_RESOURCES = {"cpu_shares": 2, "cpu_period": 100000, "cpu_quota": 0, "memory_limit_in_bytes": 0}


@dataclass
class PodSpec:
    """A pod as the kubelet would describe it to the CRI: host network, cgroupfs parent by QoS."""

    name: str
    kube_qos: str = "besteffort"  # besteffort | burstable | guaranteed
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    id: str = ""
    config_path: str = ""
    containers: dict[str, str] = field(default_factory=dict)

    @property
    def cgroup_dir(self) -> str:
        """The pod's dir relative to the hierarchy root, as runc and the agent see it."""
        qos = "" if self.kube_qos == "guaranteed" else f"/{self.kube_qos}"
        return f"kubepods{qos}/pod{self.uid}"

    def container_dir(self, name: str) -> str:
        return f"{self.cgroup_dir}/{self.containers[name]}"

    def config(self, log_dir: Path) -> dict[str, Any]:
        log_dir.mkdir(parents=True, exist_ok=True)
        return {
            "metadata": {"name": self.name, "namespace": "e2e", "uid": self.uid, "attempt": 0},
            "labels": self.labels,
            "annotations": self.annotations,
            "log_directory": str(log_dir / self.uid),
            "linux": {
                "cgroup_parent": f"/{self.cgroup_dir}",
                "security_context": {"namespace_options": {"network": 2}},  # NODE: no CNI needed
            },
        }

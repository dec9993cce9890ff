"""Where the agent's cluster configuration comes from, and its start-up check (#32 5e).

A kubeconfig given (`--kubeconfig`, `KUBECONFIG`) or found (`~/.kube/config`) selects cluster mode; so does
the in-cluster service account. A kubeconfig that is missing, a directory, unreadable, not YAML, not a
kubeconfig, or without a usable current context is a start-up error with one line naming it (the agent exits
2), never a cluster mode that retries forever. The files are merged as kubectl merges `KUBECONFIG`: missing
files in a list are skipped, the first file to set a value (the current context, a context, cluster or user
of a name) wins.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from koordqos.errors import ConfigError

IN_CLUSTER_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


@dataclass(frozen=True)
class KubeSource:
    """How the agent reaches its cluster: kubeconfig files (`origin` says how they were found) or the
    in-cluster service account (no files)."""

    origin: str  # "--kubeconfig", "KUBECONFIG", "~/.kube/config" or "in-cluster"
    paths: tuple[Path, ...] = ()

    @property
    def in_cluster(self) -> bool:
        """The service account's token and the KUBERNETES_SERVICE_* variables, no kubeconfig."""
        return not self.paths

    @property
    def kubeconfig(self) -> str | None:
        """The files as the loader takes them (`:`-separated, as in KUBECONFIG); None in-cluster."""
        return os.pathsep.join(str(p) for p in self.paths) if self.paths else None

    def describe(self) -> str:
        """The source as an error line starts: the flag or variable and its value."""
        if self.in_cluster:
            return "in-cluster config"
        if self.origin == "~/.kube/config":
            return f"~/.kube/config ({self.paths[0]})"
        return f"{self.origin} {self.kubeconfig}"


def find_source(kubeconfig: str | None, env: Mapping[str, str]) -> KubeSource | None:
    """The cluster configuration the agent uses, in kubectl's order; None: none, local mode."""
    if kubeconfig:
        return KubeSource("--kubeconfig", (Path(kubeconfig),))
    listed = [Path(p) for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        return KubeSource("KUBECONFIG", tuple(listed))
    home = Path(env.get("HOME", "/nonexistent"), ".kube", "config")
    if home.exists() or home.is_symlink():  # a dangling link is a broken kubeconfig, not an absent one
        return KubeSource("~/.kube/config", (home,))
    if env.get("KUBERNETES_SERVICE_HOST") and IN_CLUSTER_TOKEN.exists():
        return KubeSource("in-cluster")
    return None


def check_source(source: KubeSource) -> None:
    """ConfigError with one line when the kubeconfig cannot select a cluster (in-cluster: nothing to check
    here; the loader's own failure is reported when the agent loads it)."""
    if source.in_cluster:
        return
    where = source.describe()
    docs: list[dict[str, Any]] = []
    for path in source.paths:
        doc = _read(path, where, required=source.origin != "KUBECONFIG" or len(source.paths) == 1)
        if doc is not None:
            docs.append(doc)
    if not docs:
        raise ConfigError(f"{where}: none of its files exists")
    current = next((str(d["current-context"]) for d in docs if d.get("current-context")), "")
    if not current:
        raise ConfigError(f"{where}: no current-context (select one: kubectl config use-context NAME)")
    contexts = _named(docs, "contexts")
    if current not in contexts:
        known = _names(contexts)
        raise ConfigError(f"{where}: current-context {current!r} is not among its contexts {known}")
    context = contexts[current].get("context")
    cluster_name = str(context.get("cluster") or "") if isinstance(context, dict) else ""
    clusters = _named(docs, "clusters")
    if cluster_name not in clusters:
        raise ConfigError(
            f"{where}: context {current!r} names cluster {cluster_name!r}, "
            f"which is not among its clusters {_names(clusters)}"
        )
    cluster = clusters[cluster_name].get("cluster")
    if not isinstance(cluster, dict) or not cluster.get("server"):
        raise ConfigError(f"{where}: cluster {cluster_name!r} has no server")


def _read(path: Path, where: str, required: bool) -> dict[str, Any] | None:
    """One kubeconfig file as a mapping; None when it is absent and need not exist."""
    prefix = where if required else f"{where}: {path}"
    try:
        text = path.read_text()
    except FileNotFoundError:
        if not required:
            return None
        raise ConfigError(f"{prefix}: does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{prefix}: is a directory, not a kubeconfig file") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"{prefix}: cannot read: {reason}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(f"{prefix}: not valid YAML{at}: {problem}") from None
    if not isinstance(doc, dict):
        raise ConfigError(
            f"{prefix}: not a kubeconfig (expected a mapping with clusters, contexts, users, current-context)"
        )
    return doc


def _named(docs: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    """`name → entry` of one list across the files, the first file's entry winning."""
    out: dict[str, dict[str, Any]] = {}
    for doc in docs:
        entries = doc.get(key)
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict) and entry.get("name") is not None:
                out.setdefault(str(entry["name"]), entry)
    return out


def _names(entries: Mapping[str, Any]) -> str:
    return "(" + ", ".join(repr(n) for n in sorted(entries)) + ")" if entries else "(none)"

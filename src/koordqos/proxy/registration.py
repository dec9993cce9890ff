"""The registration file koord-runtime-proxy reads: `<config dir>/koordlet.json`
(docs/behaviour-runtime-hooks.md, "Proxy mode").

    {"remote-endpoint": "/var/run/koordlet/koordlet.sock", "failure-policy": "Ignore",
     "runtime-hooks": ["PreRunPodSandbox", "PreCreateContainer", ...]}

The proxy watches the directory and calls the endpoint for the listed stages, applying `failure-policy`
when the agent errors or is unreachable. Stages are those with at least one hook and an RPC, in the fixed
stage order (docs/behaviour-runtime-hooks.md, "Project decisions": deterministic, no PreRemoveRunPodSandbox).
The file is replaced atomically (temp file + rename, so the watcher never reads half a file) and rewritten
whenever it is missing or differs, which keeps it current if someone deletes or edits it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

import structlog

from koordqos import observability as obs
from koordqos.hooks.context import STAGES, Stage
from koordqos.hooks.framework import HookRegistry
from koordqos.proxy import telemetry as m
from koordqos.proxy.service import RPC_STAGES

log = structlog.get_logger("koordqos.proxy")

FILE_NAME = "koordlet.json"


def proxy_stages(registry: HookRegistry, disabled: Iterable[Stage] = ()) -> list[Stage]:
    """Stages to register: with hooks, served by an RPC, not disabled, in the fixed stage order."""
    return [s for s in registry.stages(frozenset(disabled)) if s in RPC_STAGES]


def render_registration(endpoint: str, failure_policy: str, stages: Iterable[Stage]) -> str:
    """The file's content (indented JSON, keys in koordlet's order, stages in the fixed order)."""
    wanted = frozenset(stages)
    ordered = [s.value for s in STAGES if s in wanted]
    doc = {"remote-endpoint": endpoint, "failure-policy": failure_policy, "runtime-hooks": ordered}
    return json.dumps(doc, indent=2) + "\n"


class RegistrationFile:
    """Keeps `<directory>/koordlet.json` equal to `content`."""

    def __init__(self, directory: Path, content: str) -> None:
        self.path = Path(directory) / FILE_NAME
        self.content = content
        self._failing = False

    def sync(self) -> bool:
        """Write the file if it is missing or differs; True when written. Errors are logged and counted."""
        try:
            if self.path.read_text(encoding="utf-8") == self.content:
                self._failing = False
                return False
        except FileNotFoundError:
            pass
        except (OSError, UnicodeDecodeError):
            pass  # unreadable: replace it
        tmp = self.path.with_name(f".{FILE_NAME}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(self.content, encoding="utf-8")
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except OSError as exc:
            m.REGISTRATION_WRITES.labels("failed").inc()
            obs.ERRORS.labels("proxy", "registration_write").inc()
            if not self._failing:  # once per failure streak, not every refresh
                log.error(
                    "cannot write the runtime-proxy registration file", path=str(self.path), error=str(exc)
                )
            self._failing = True
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            return False
        m.REGISTRATION_WRITES.labels("written").inc()
        log.info("runtime-proxy registration file written", path=str(self.path))
        self._failing = False
        return True

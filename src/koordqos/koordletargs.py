"""koordlet's command line in koordqos's terms: a koordlet DaemonSet's arguments start koordqos (#32 6).

koordlet parses its flags with Go's `flag` package: one dash or two, `-name=value` or `-name value`, a
boolean flag alone means true and never takes a separate value. `translate` turns such an argument list
into koordqos's: a koordqos flag written with one dash gets two; a koordlet flag becomes the koordqos flag
with the same meaning (placed before the koordqos flags given, so one given as well wins); a koordlet flag
with no effect in koordqos is dropped and listed (the agent warns once at start); anything else is left for
the parser to report. `KOORDLET_FLAGS` is the table (docs/configuration.md shows it).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal

from koordqos.errors import ConfigError
from koordqos.model.duration import parse_go_duration

Kind = Literal["value", "bool", "duration", "verbosity"]


@dataclass(frozen=True)
class KoordletFlag:
    """One koordlet flag: the koordqos flag it becomes (`to`; "" when it has no effect) and what it means."""

    name: str
    to: str
    note: str
    kind: Kind = "value"


KOORDLET_FLAGS: tuple[KoordletFlag, ...] = (
    KoordletFlag("addr", "http-addr", "the HTTP address (`:9316`: every address)"),
    KoordletFlag("cgroup-root-dir", "cgroup-root", "the cgroup root"),
    KoordletFlag("proc-root-dir", "proc-root", "the procfs root"),
    KoordletFlag("sys-root-dir", "sys-root", "the sysfs root"),
    KoordletFlag(
        "var-run-root-dir",
        "nri-socket",
        "with `-runtime-hooks-nri-socket-path` (default `nri/nri.sock`): the NRI socket, joined under it",
    ),
    KoordletFlag(
        "runtime-hooks-nri-socket-path",
        "nri-socket",
        "the NRI socket, joined under `-var-run-root-dir` (`/var/run/` when not given) unless absolute",
    ),
    KoordletFlag("enable-nri-runtime-hook", "enable-nri", "serve runtime hooks over NRI", "bool"),
    KoordletFlag(
        "runtime-hooks-nri-plugin-name", "nri-plugin-name", "the NRI plugin name (koordlet's: `koordlet_nri`)"
    ),
    KoordletFlag("runtime-hooks-nri-plugin-index", "nri-plugin-index", "the NRI plugin index"),
    KoordletFlag(
        "runtime-hooks-nri-connect-timeout", "nri-connect-timeout-seconds", "NRI connect timeout", "duration"
    ),
    KoordletFlag(
        "runtime-hooks-nri-backoff-duration", "nri-backoff-seconds", "first NRI reconnect backoff", "duration"
    ),
    KoordletFlag("runtime-hooks-nri-backoff-cap", "nri-backoff-cap-seconds", "NRI backoff cap", "duration"),
    KoordletFlag(
        "collect-res-used-interval", "collect-interval", "the metrics collection period", "duration"
    ),
    KoordletFlag("v", "log-level", "klog verbosity: 4 and above `debug`, below `info`", "verbosity"),
    KoordletFlag(
        "logtostderr", "", "koordqos always logs to stderr (`true`: the same; `false`: no effect)", "bool"
    ),
    KoordletFlag(
        "runtime-hooks-network", "", "`unix`: the same (the hook service's only network); else an error"
    ),
    KoordletFlag(
        "runtime-hooks-plugin-failure-policy",
        "",
        "no effect: koordqos has one failure policy, `--runtime-hooks-failure-policy`",
    ),
    KoordletFlag(
        "runtime-hooks-nri-backoff-steps", "", "no effect: the NRI backoff doubles up to its cap, without end"
    ),
    KoordletFlag(
        "runtime-hooks-nri-backoff-factor",
        "",
        "no effect: the NRI backoff doubles up to its cap, without end",
    ),
    KoordletFlag("sys-fs-root-dir", "", "no effect: resctrl is read at `<--sys-root>/fs/resctrl`"),
    KoordletFlag(
        "kubelet-sync-interval", "", "no effect: koordqos watches its pods on the API server, not the kubelet"
    ),
    KoordletFlag(
        "kubelet-preferred-address-type", "", "no effect: koordqos does not call the kubelet for pods"
    ),
    KoordletFlag(
        "kubelet-insecure-tls", "", "no effect: koordqos does not call the kubelet for pods", "bool"
    ),
    KoordletFlag("default-runtime-type", "", "no effect: containers are known from NRI and the cgroup names"),
    KoordletFlag("enable-pod-taskids", "", "no effect: resctrl reads pods' threads itself", "bool"),
    KoordletFlag(
        "enable-pagecache-collector", "", "no effect: the NodeMetric's page cache follows its policy", "bool"
    ),
    KoordletFlag("collect-sys-metric-outdated-interval", "", "no effect in koordqos"),
    KoordletFlag("enable-pprof", "", "no effect: koordqos serves no pprof", "bool"),
    KoordletFlag("pprof-addr", "", "no effect: koordqos serves no pprof"),
)
_BY_NAME = {f.name: f for f in KOORDLET_FLAGS}
_TRUE = {"true", "1", "t", "yes", "on"}  # Go's strconv.ParseBool, and koordqos's own spellings
_FALSE = {"false", "0", "f", "no", "off"}
DEBUG_VERBOSITY = 4  # klog's "debug level verbosity" (Kubernetes logging conventions)
DEFAULT_VAR_RUN = "/var/run"
DEFAULT_NRI_SOCKET_PATH = "nri/nri.sock"


@dataclass
class Translated:
    """koordqos's argument list, and the koordlet flags given that have no effect in koordqos."""

    argv: list[str]
    ignored: list[str] = field(default_factory=list)


def translate(argv: Sequence[str], own: Collection[str]) -> Translated:
    """`argv` (a command's arguments) in koordqos's terms; `own`: koordqos's flag names (ConfigError for a
    koordlet flag without its value or with one koordqos cannot mean the same by)."""
    own_args: list[str] = []
    koordlet_args: list[str] = []
    ignored: list[str] = []
    nri: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":  # the end of the flags: the rest as given
            own_args += argv[i - 1 :]
            break
        name, sep, value = arg.lstrip("-").partition("=")
        dashes = len(arg) - len(arg.lstrip("-"))
        if dashes not in (1, 2) or not name or not name[0].isalpha():
            own_args.append(arg)  # a value, a positional or a negative number
            continue
        if name in own:
            own_args.append(f"--{name}" + (f"={value}" if sep else ""))
            continue
        flag = _BY_NAME.get(name)
        if flag is None:
            own_args.append(arg)  # the parser reports it
            continue
        if not sep and flag.kind != "bool":
            if i >= len(argv):
                raise ConfigError(f"-{name}: needs a value")
            value, i = argv[i], i + 1
        elif not sep:
            value = "true"
        if flag.name in ("var-run-root-dir", "runtime-hooks-nri-socket-path"):
            nri[flag.name] = value
            continue
        meant = _meaning(flag, value)
        if meant is None:
            ignored.append(f"-{name}={value}")
        elif meant:
            koordlet_args.append(meant)
    if nri:
        root = nri.get("var-run-root-dir", DEFAULT_VAR_RUN)
        koordlet_args.append(
            "--nri-socket="
            + os.path.join(root, nri.get("runtime-hooks-nri-socket-path", DEFAULT_NRI_SOCKET_PATH))
        )
    return Translated(koordlet_args + own_args, ignored)


def _meaning(flag: KoordletFlag, value: str) -> str | None:
    """The koordqos argument `flag`=`value` becomes; "" when it means what koordqos does anyway; None when it
    has no effect in koordqos."""
    if flag.kind == "bool":
        low = value.lower()
        if low not in _TRUE | _FALSE:
            raise ConfigError(f"-{flag.name}: invalid boolean {value!r}")
        value = "true" if low in _TRUE else "false"
    if flag.name == "logtostderr":
        return "" if value == "true" else None
    if flag.name == "runtime-hooks-network":
        if value != "unix":
            raise ConfigError(
                f"-runtime-hooks-network {value!r}: koordqos serves the runtime hooks on a unix socket only"
            )
        return ""
    if not flag.to:
        return None
    if flag.kind == "duration":
        try:
            value = repr(_seconds(value))
        except ValueError:
            raise ConfigError(f"-{flag.name}: invalid duration {value!r} (e.g. 10s, 1m30s)") from None
    elif flag.kind == "verbosity":
        try:
            level = int(value)
        except ValueError:
            raise ConfigError(f"-{flag.name}: invalid verbosity {value!r} (a number, e.g. 4)") from None
        value = "debug" if level >= DEBUG_VERBOSITY else "info"
    return f"--{flag.to}={value}"


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return parse_go_duration(text)


def markdown() -> str:
    """The table of koordlet's flags for docs/configuration.md."""
    rows = ["| koordlet flag | koordqos | meaning |", "|---|---|---|"]
    for flag in KOORDLET_FLAGS:
        to = f"`--{flag.to}`" if flag.to else "—"
        rows.append(f"| `-{flag.name}` | {to} | {flag.note} |")
    return "\n".join(rows)

"""Loading `AgentConfig`: flags > `KOORDQOS_*` environment > `--config` file > defaults, one clear line on
a bad value (`ConfigError`)."""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from koordqos.config import AgentConfig, build_config
from koordqos.configflags import FLAGS, Flag, default_tree, env_name, flag_default, flag_metavar
from koordqos.errors import ConfigError


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add every AgentConfig flag to `parser` (values default to None: unset)."""
    defaults = default_tree()
    for flag in FLAGS:
        opt = "--" + flag.name
        default = flag_default(flag, defaults)
        shown = f"; default {default}" if default else ""
        # argparse's own %(default)s would show None: the value is "unset" until defaults are applied
        helptext = f"{flag.help} [env {env_name(flag)}{shown}]".replace("%", "%%")
        metavar = flag_metavar(flag)
        if flag.kind is bool:
            parser.add_argument(
                opt, dest=_dest(flag), nargs="?", const="true", default=None, metavar=metavar, help=helptext
            )
        else:
            parser.add_argument(
                opt,
                dest=_dest(flag),
                default=None,
                choices=flag.choices,
                metavar="{" + ",".join(flag.choices) + "}" if flag.choices else metavar,
                help=helptext,
            )


def _dest(flag: Flag) -> str:
    return "opt_" + flag.name.replace("-", "_")


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value


def load_config(
    args: argparse.Namespace | None = None,
    env: Mapping[str, str] | None = None,
) -> AgentConfig:
    """Build AgentConfig from defaults < config file < env < flags; raise ConfigError with one clear line."""
    env = os.environ if env is None else env
    values: dict[str, str] = {}
    for flag in FLAGS:
        if env_name(flag) in env:
            values[flag.name] = env[env_name(flag)]
        if args is not None and getattr(args, _dest(flag), None) is not None:
            values[flag.name] = getattr(args, _dest(flag))
    tree: dict[str, Any] = {}
    cfg_file = values.pop("config", None)
    if cfg_file:
        tree = read_config_file(Path(cfg_file))
    for flag in FLAGS:
        if flag.name in values:
            raw = values[flag.name]
            _set(tree, flag.target, _coerce(flag, raw))
    kube = tree.setdefault("kube", {})
    if not kube.get("node_name"):
        kube["node_name"] = env.get("NODE_NAME") or socket.gethostname()
    return build_config(tree)


def _coerce(flag: Flag, raw: str) -> Any:
    if flag.kind is bool:
        low = str(raw).lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"--{flag.name}: invalid boolean {raw!r}")
    return raw


def read_config_file(path: Path) -> dict[str, Any]:
    """Read an AgentConfig YAML file into a plain tree."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data

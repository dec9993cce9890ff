"""The event mask a runtime's Configure request leaves the plugin with.

The plugin's own mask, replaced by a runtime-provided plugin config (YAML `{events: [...]}`), narrowed to
the events a pre-v0.10 runtime knows. A config that does not parse, or a mask left empty, is a ConfigError:
the session answers it with INVALID_ARGUMENT.
"""

from __future__ import annotations

import re

import structlog
import yaml

from koordqos.errors import ConfigError
from koordqos.nri.mask import VALID_EVENTS_LEGACY, parse_event_mask, validate_event_mask

__all__ = ["configured_mask"]

log = structlog.get_logger("koordqos.nri")


def configured_mask(mask: int, config: str, nri_version: str) -> int:
    """The mask to answer Configure with: `mask` (the plugin's), or the one `config` names when it is not
    blank, narrowed for an old (or unnamed) `nri_version`; ConfigError when none is left."""
    if config.strip():
        try:
            mask = validate_event_mask(_mask_from_config(config))
        except ConfigError as exc:
            log.error("NRI plugin configuration rejected", error=str(exc))
            raise
    if _version(nri_version) < (0, 10):
        # no (or a pre-v0.10) NRI version: stay inside the events every runtime knows
        narrowed = mask & VALID_EVENTS_LEGACY
        if narrowed != mask:
            log.warning(
                "NRI runtime too old for some events; not subscribing to them",
                dropped=f"{mask & ~narrowed:#x}",
                nri_version=nri_version or "(none)",
            )
        mask = narrowed
    if mask == 0:
        raise ConfigError("no NRI event left to subscribe to on this runtime")
    return mask


def _version(text: str) -> tuple[int, int]:
    """(major, minor) of an NRI module version like `v0.12.2`; (0, 0) when absent or unparsable."""
    found = re.match(r"v?(\d+)\.(\d+)", text)
    return (int(found[1]), int(found[2])) if found else (0, 0)


def _mask_from_config(text: str) -> int:
    """The event mask from the runtime-provided plugin config (YAML `{events: [...]}`)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid NRI plugin config: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("events"), list):
        raise ConfigError("NRI plugin config must be a mapping with an `events` list")
    return parse_event_mask([str(e) for e in data["events"]])

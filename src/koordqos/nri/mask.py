"""NRI event subscription masks: event bits, the default subscription, what a runtime accepts.

Pure: no I/O. The plugin subscribes with an explicit mask on Configure; `--runtime-hooks-disable-stages`
narrows it, and a runtime-provided plugin config (`events: [...]`) replaces it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from koordqos.errors import ConfigError
from koordqos.nri.api import nri_api_pb2 as api

VALID_EVENTS_LEGACY = 0x07FF  # NRI v0.3-v0.9 (a runtime that sends no NRI_version may be one of these)
VALID_EVENTS = 0x3FFF  # NRI v0.10+


def event_bit(event: int) -> int:
    """The subscription-mask bit of an NRI Event enum value."""
    return 1 << (event - 1)


DEFAULT_EVENTS = (
    event_bit(api.RUN_POD_SANDBOX)
    | event_bit(api.STOP_POD_SANDBOX)
    | event_bit(api.REMOVE_POD_SANDBOX)
    | event_bit(api.CREATE_CONTAINER)
    | event_bit(api.POST_START_CONTAINER)
    | event_bit(api.UPDATE_CONTAINER)
    | event_bit(api.STOP_CONTAINER)
    | event_bit(api.REMOVE_CONTAINER)
)
# Events we never subscribe to: being a validator makes every creation depend on us, and UpdatePodSandbox
# has no StateChange fallback on older runtimes.
_FORBIDDEN_EVENTS = event_bit(api.VALIDATE_CONTAINER_ADJUSTMENT) | event_bit(api.UPDATE_POD_SANDBOX)


# The NRI events that carry each runtime-hook stage: `--runtime-hooks-disable-stages` takes them out of the
# subscription, so a disabled stage costs the runtime no round trip (docs/behaviour-nri.md,
# "Events and answers").
STAGE_EVENTS: dict[str, int] = {
    "PreRunPodSandbox": event_bit(api.RUN_POD_SANDBOX),
    "PreCreateContainer": event_bit(api.CREATE_CONTAINER),
    "PreUpdateContainerResources": event_bit(api.UPDATE_CONTAINER),
    "PreRemoveRunPodSandbox": event_bit(api.REMOVE_POD_SANDBOX),
}


def mask_without_stages(mask: int, disabled: Sequence[str]) -> int:
    """`mask` less the events of the disabled stages (stages with no NRI event change nothing)."""
    for stage in disabled:
        mask &= ~STAGE_EVENTS.get(stage, 0)
    return mask


def _norm(name: str) -> str:
    return re.sub(r"[^a-z]", "", name.lower())


_EVENT_BY_NAME = {_norm(n): v for n, v in api.Event.items() if v not in (api.UNKNOWN, api.LAST)}


def parse_event_mask(names: Sequence[str]) -> int:
    """Mask from event names (`RunPodSandbox`, `run_pod_sandbox`, …); ConfigError on an unknown name."""
    mask = 0
    for name in names:
        ev = _EVENT_BY_NAME.get(_norm(str(name)))
        if ev is None:
            raise ConfigError(f"unknown NRI event {name!r}")
        mask |= event_bit(ev)
    return mask


def validate_event_mask(mask: int) -> int:
    """`mask` if a runtime accepts it from us (non-zero, known events, not a validator); else ConfigError."""
    if mask == 0:
        raise ConfigError(
            "NRI event mask must not be empty (0 subscribes to everything, validation included)"
        )
    if mask & ~VALID_EVENTS:
        raise ConfigError(f"NRI event mask {mask:#x} has bits outside {VALID_EVENTS:#x}")
    if mask & _FORBIDDEN_EVENTS:
        raise ConfigError(f"NRI event mask {mask:#x} must not include UpdatePodSandbox or validation")
    return mask

"""koordqos.host: intents and the actuator for host writes outside cgroup files.

Intents: `SysctlWrite(name, value)` (beneath `<proc-root>/sys`), `OomScoreAdjWrite(pid, value)`,
`CoreSchedCookie(pod_uid, container_id, pids, enable, group)` and `CoreSchedPrune(live_containers)`,
`SysfsWrite(path, value)` (beneath `<sys-root>`), and the resctrl group, schemata and task intents.
`HostActuator.apply(strategy, intents, reason)` carries them out off the loop, confined beneath the
roots at open time, write-if-different, dry-run aware, with an explicit `Outcome` per intent.
"""

from koordqos.host.actuator import HANDLERS, HostActuator, HostIntent
from koordqos.host.coresched import CookieManager, CookieOps, CoreSchedCookie, CoreSchedPrune, PrctlCookieOps
from koordqos.host.oom import OomScoreAdjWrite
from koordqos.host.outcome import HostResult, Outcome
from koordqos.host.resctrl import (
    ResctrlGroupCreate,
    ResctrlGroupRemove,
    ResctrlSchemataWrite,
    ResctrlTasksAdd,
)
from koordqos.host.sysctl import SysctlWrite
from koordqos.host.sysfs import SysfsWrite

__all__ = [
    "HANDLERS",
    "CookieManager",
    "CookieOps",
    "CoreSchedCookie",
    "CoreSchedPrune",
    "HostActuator",
    "HostIntent",
    "HostResult",
    "OomScoreAdjWrite",
    "Outcome",
    "PrctlCookieOps",
    "ResctrlGroupCreate",
    "ResctrlGroupRemove",
    "ResctrlSchemataWrite",
    "ResctrlTasksAdd",
    "SysctlWrite",
    "SysfsWrite",
]

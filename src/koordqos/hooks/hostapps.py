"""NodeSLO host applications (docs/behaviour-runtime-hooks.md, "Host applications"): their cgroup dir and
their hook context."""

from __future__ import annotations

from koordqos.cgroups.layout import CgroupLayout
from koordqos.hooks.context import HostAppContext, HostAppRequest, qos_from_name
from koordqos.metrics.hostapp import host_app_dir
from koordqos.model.nodeslo import CgroupPath, HostApplicationSpec
from koordqos.model.qos import QoSClass


def host_app_cgroup_path(app: HostApplicationSpec) -> CgroupPath:
    """The app's cgroupPath, or the default one (docs/behaviour-runtime-hooks.md, "Host applications"):
    host-latency-sensitive / host-best-effort / root."""
    if app.cgroup_path is not None:
        return app.cgroup_path
    qos = qos_from_name(app.qos)
    if qos in (QoSClass.LSE, QoSClass.LSR, QoSClass.LS):
        parent = "host-latency-sensitive"
    elif qos is QoSClass.BE:
        parent = "host-best-effort"
    else:
        parent = ""
    return CgroupPath(base="CgroupRoot", parentDir=parent, relativePath=app.name)


def host_app_context(layout: CgroupLayout, app: HostApplicationSpec) -> HostAppContext:
    """HostAppContext with the checked, confined cgroup dir (CgroupError / PathEscapeError if refused)."""
    rel = host_app_dir(layout, host_app_cgroup_path(app))
    return HostAppContext(HostAppRequest(name=app.name, qos=qos_from_name(app.qos), cgroup_parent=rel))

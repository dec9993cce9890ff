"""Order and restarts on the real runtime: the agent after the containers, containerd restarted under the
agent, the agent restarted under containerd. Every BE container must end up with its batch limits.

The hooks reconciler is slowed to once an hour here, so a corrected container cgroup can only be the
runtime applying the agent's Synchronize (or CreateContainer) reply, not the agent writing files itself.
"""

from __future__ import annotations

import pytest

from koordqos.testing.poll import wait_until_sync

from .agentproc import Agent
from .cri import BE_RESOURCES, SLEEP, PodSpec
from .prereq import POLL
from .stack import Stack
from .test_seed import MI, UNLIMITED, batch_values, be_pod

pytestmark = pytest.mark.e2e_runtime
BATCH = (200000, 1536, 256 * MI)
PLAIN = (-1, 2, UNLIMITED)
NO_RECONCILE = ("--runtime-hooks-reconcile-interval", "3600")


def all_adjusted(rt: Stack, pods: list[PodSpec]) -> list[str]:
    """Containers of `pods` whose cgroup lacks the batch limits (empty: all adjusted)."""
    return [
        f"{p.name}/{name}={batch_values(rt, p.container_dir(name))}"
        for p in pods
        for name in p.containers
        if batch_values(rt, p.container_dir(name)) != BATCH
    ]


def syncs(agent: Agent) -> float:
    return agent.metric("koordqos_nri_requests_total", method="Synchronize")


def wait_syncs(agent: Agent, n: int) -> None:
    """Until the agent answered its n-th Synchronize: /readyz's `nri_connected` turns true at Configure,
    before the Synchronize (which now yields to the loop while it runs) is answered and counted."""
    wait_until_sync(lambda: syncs(agent) >= n, 30, POLL, f"Synchronize #{n} answered")


def test_agent_started_after_the_containers_corrects_them(rt: Stack) -> None:
    pods = [be_pod(f"early-{i}") for i in range(2)]
    for p in pods:
        rt.cri.run_pod(p)
        rt.cri.run_container(p, "main", SLEEP, **BE_RESOURCES)
        assert batch_values(rt, p.container_dir("main")) == PLAIN  # nobody adjusted them yet
    agent = rt.agent(*NO_RECONCILE)
    agent.start()
    agent.wait_connected()
    wait_syncs(agent, 1)
    assert syncs(agent) == 1  # one connection, no reconnect
    wait_until_sync(
        lambda: not all_adjusted(rt, pods), 30, POLL, "Synchronize to correct the running containers"
    )


def test_containerd_restarted_under_a_running_agent(rt: Stack) -> None:
    agent = rt.agent(*NO_RECONCILE)
    agent.start()
    agent.wait_connected()
    before = be_pod("before")
    rt.cri.run_pod(before)
    rt.cri.run_container(before, "main", SLEEP, **BE_RESOURCES)
    assert not all_adjusted(rt, [before])
    reconnects = agent.metric("koordqos_nri_reconnects_total")

    assert rt.containerd.stop() == 0
    wait_until_sync(
        lambda: agent.readyz().get("nri_connected") is False, 30, POLL, "the agent to notice containerd left"
    )
    rt.containerd.start(rt.cri)  # same root and state: the running containers are still there
    # a pod created right away may race the agent's reconnect: created plain, then fixed by Synchronize
    after = be_pod("after")
    rt.cri.run_pod(after)
    rt.cri.run_container(after, "main", SLEEP, **BE_RESOURCES)
    agent.wait_connected()
    assert agent.metric("koordqos_nri_reconnects_total") >= reconnects + 1
    wait_syncs(agent, 2)
    wait_until_sync(
        lambda: not all_adjusted(rt, [before, after]), 30, POLL, "every container adjusted after the restart"
    )
    assert rt.cri.inspect(before.containers["main"])["status"]["state"] == "CONTAINER_RUNNING"


def test_agent_restarted_under_a_running_containerd(rt: Stack) -> None:
    first = rt.agent(*NO_RECONCILE)
    first.start()
    first.wait_connected()
    old = be_pod("old")
    rt.cri.run_pod(old)
    rt.cri.run_container(old, "main", SLEEP, **BE_RESOURCES)
    assert first.stop() == 0  # SIGTERM: a clean exit
    # containerd drops the closed plugin; what is created meanwhile gets plain values
    gap = be_pod("gap")
    rt.cri.run_pod(gap)
    rt.cri.run_container(gap, "main", SLEEP, **BE_RESOURCES)
    assert batch_values(rt, gap.container_dir("main")) == PLAIN
    second = rt.agent(*NO_RECONCILE)
    second.start()
    second.wait_connected()
    wait_until_sync(
        lambda: not all_adjusted(rt, [old, gap]),
        30,
        POLL,
        "the restarted agent to correct the gap's container",
    )
    new = be_pod("new")
    rt.cri.run_pod(new)
    rt.cri.run_container(new, "main", SLEEP, **BE_RESOURCES)
    assert not all_adjusted(rt, [old, gap, new])

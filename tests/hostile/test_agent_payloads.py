"""Hostile proxy and NRI payloads against the agent as a subprocess (tests.support.fuzz): each request gets
an answer (a reply or an error status), the agent stays up, RSS and fds stay bounded, and a valid session
works afterwards. The long run of the same harness is bench/fuzz.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from koordqos.proxy.api import runtime_api_pb2 as rpb
from tests.support.fuzz import FuzzTarget, Mutator, proxy_call, proxy_seeds

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def target() -> AsyncIterator[FuzzTarget]:
    async with FuzzTarget() as t:
        yield t


_PROXY_SEEDS = proxy_seeds(FuzzTarget.seed_scenario())


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(index=st.integers(0, len(_PROXY_SEEDS) - 1), seed=st.integers(0, 2**32), raw=st.binary(max_size=200))
async def test_mutated_proxy_messages_are_answered_and_the_agent_stays_up(
    target: FuzzTarget, index: int, seed: int, raw: bytes
) -> None:
    assert target.channel is not None
    method, payload = _PROXY_SEEDS[index]
    for body in (Mutator(seed).mutate(payload), raw):
        outcome = await proxy_call(target.channel, method, body, timeout=5)
        assert outcome == "ok" or outcome.startswith("grpc:"), outcome
    assert target.alive(), target.agent_log()


async def test_after_the_hostile_input_a_valid_session_works_and_vitals_are_bounded(
    target: FuzzTarget,
) -> None:
    assert target.channel is not None
    for method, payload in _PROXY_SEEDS:
        assert await proxy_call(target.channel, method, payload, timeout=5) == "ok", method
    batch = next(p for p in target.scenario.pods if p.name == "batch-job")
    req = rpb.PodSandboxHookRequest(
        pod_meta=rpb.PodSandboxMetadata(name=batch.name, namespace=batch.namespace, uid=batch.uid),
        labels=dict(batch.labels),
        annotations=dict(batch.annotations),
        cgroup_parent=batch.linux.cgroup_parent,
    )
    assert await proxy_call(target.channel, "PreRunPodSandboxHook", req.SerializeToString(), 5) == "ok"
    vitals = target.vitals()
    assert vitals.fds < 200
    assert vitals.rss_kib < 400 * 1024
    assert target.alive()

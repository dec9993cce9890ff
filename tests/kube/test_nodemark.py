"""NodeMarker against the fake API server: our condition and PreferNoSchedule taint added and removed,
everyone else's kept, a concurrent change (409) computed again."""

from __future__ import annotations

from typing import Any

from koordqos.kube import KubeConnection
from koordqos.kube.client import KubeClient
from koordqos.kube.nodemark import NodeMarker, with_condition, with_taint
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.fake_objects import make_node

from .conftest import NODE

KEY = "koordqos.io/interference"
COND = "KoordQoSInterference"


def _seed(fake: FakeAPIServer) -> None:
    node = make_node(NODE)
    node["spec"] = {"taints": [{"key": "other.io/maintenance", "effect": "NoSchedule"}]}
    node["status"]["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
    fake.upsert("nodes", node)


async def test_mark_and_unmark_keep_what_others_own(fake: FakeAPIServer, conn: KubeConnection) -> None:
    _seed(fake)
    marker = NodeMarker(conn.get, NODE)
    assert await marker.mark(COND, KEY, "PSIInterference", "cpu stall 0.30")
    node = fake.get("nodes", NODE, "")
    assert node is not None
    assert {t["key"]: t["effect"] for t in node["spec"]["taints"]} == {
        "other.io/maintenance": "NoSchedule",
        KEY: "PreferNoSchedule",
    }
    conds = {c["type"]: c for c in node["status"]["conditions"]}
    assert conds["Ready"]["status"] == "True"
    assert conds[COND]["status"] == "True"
    assert conds[COND]["message"] == "cpu stall 0.30"
    rv = node["metadata"]["resourceVersion"]
    assert await marker.mark(COND, KEY, "PSIInterference", "cpu stall 0.30")  # already so: nothing written
    assert fake.get("nodes", NODE, "")["metadata"]["resourceVersion"] == rv  # type: ignore[index]
    assert await marker.unmark(COND, KEY, "PSIInterferenceCleared", "clean")
    node = fake.get("nodes", NODE, "")
    assert node is not None
    assert [t["key"] for t in node["spec"]["taints"]] == ["other.io/maintenance"]
    conds = {c["type"]: c for c in node["status"]["conditions"]}
    assert conds[COND]["status"] == "False"
    assert conds["Ready"]["status"] == "True"


async def test_a_concurrent_change_is_a_conflict_and_computed_again(
    fake: FakeAPIServer, conn: KubeConnection
) -> None:
    _seed(fake)
    real = await conn.get()
    changed = []

    class Racing:
        """The client, except that someone else adds a taint right after our first read."""

        async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
            out = await real.request(method, path, **kw)
            if method == "GET" and not changed:
                node = fake.get("nodes", NODE, "")
                assert node is not None
                node["spec"]["taints"].append({"key": "late.io/added", "effect": "NoExecute"})
                fake.upsert("nodes", node)
                changed.append(True)
            return out

    async def client() -> KubeClient:
        return Racing()  # type: ignore[return-value]

    assert await NodeMarker(client, NODE).mark(COND, KEY, "PSIInterference", "stall")
    node = fake.get("nodes", NODE, "")
    assert node is not None
    assert {t["key"] for t in node["spec"]["taints"]} == {"other.io/maintenance", "late.io/added", KEY}


async def test_a_missing_node_fails_without_raising(fake: FakeAPIServer, conn: KubeConnection) -> None:
    assert not await NodeMarker(conn.get, "no-such-node").mark(COND, KEY, "PSIInterference", "stall")


def test_pure_edits() -> None:
    assert with_taint([], KEY, False) is None
    assert with_taint([{"key": KEY, "effect": "PreferNoSchedule"}], KEY, True) is None
    assert with_taint([{"key": KEY, "effect": "NoSchedule"}], KEY, True) == [
        {"key": KEY, "effect": "NoSchedule"},
        {"key": KEY, "value": "true", "effect": "PreferNoSchedule"},
    ]  # someone else's taint with our key and another effect is not ours
    assert with_condition([], COND, False, "r", "m") is None  # nothing to clear
    same = [{"type": COND, "status": "True", "lastTransitionTime": "t0"}]
    assert with_condition(same, COND, True, "r", "m") is None

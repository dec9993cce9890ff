"""SystemConfigReconcile planner: every koordlet case (docs/reconcile.md, "System config")."""

from __future__ import annotations

from koordqos.model.nodeslo import SystemStrategy, parse_nodeslo
from koordqos.strategies.sysconfig import (
    MIN_FREE_KBYTES,
    OPTIONAL_FILES,
    PAGECACHE_LIMIT,
    REAP_BACKGROUND,
    SCHED_FEATURES,
    SCHED_GROUP_IDENTITY,
    SCHED_IDLE_SAVER_WMARK,
    WATERMARK_SCALE_FACTOR,
    SysInputs,
    min_free_kbytes,
    parse_sched_features,
    plan_system_config,
)

NODE_512GI = 512 * 1024**3  # 536870912 kB
ALL = frozenset(OPTIONAL_FILES)


def _strategy(**kw: object) -> SystemStrategy:
    slo = parse_nodeslo({"spec": {"systemStrategy": kw}})
    assert slo.system_strategy is not None
    return slo.system_strategy


def _writes(strategy: SystemStrategy | None, memory: int | None = NODE_512GI, **kw: object) -> dict[str, str]:
    plan = plan_system_config(SysInputs(strategy, memory, ALL, **kw))  # type: ignore[arg-type]
    return {w.target: w.value for w in plan.writes}


def test_spec_values_4724464_99_1() -> None:
    assert min_free_kbytes(NODE_512GI, 100) == 5368709  # the initial file of koordlet's fixture
    got = _writes(_strategy(minFreeKbytesFactor=88, watermarkScaleFactor=99, memcgReapBackGround=1))
    assert got == {MIN_FREE_KBYTES: "4724464", WATERMARK_SCALE_FACTOR: "99", REAP_BACKGROUND: "1"}


def test_out_of_range_values_leave_files_unchanged() -> None:
    plan = plan_system_config(
        SysInputs(
            _strategy(minFreeKbytesFactor=400, watermarkScaleFactor=500, memcgReapBackGround=2),
            NODE_512GI,
            ALL,
        )
    )
    assert plan.writes == []
    assert set(plan.problems) == {"minFreeKbytesFactor", "watermarkScaleFactor", "memcgReapBackGround"}
    assert "21474836" in plan.problems["minFreeKbytesFactor"]
    plan = plan_system_config(
        SysInputs(
            _strategy(minFreeKbytesFactor=0, watermarkScaleFactor=5, memcgReapBackGround=-1), NODE_512GI, ALL
        )
    )
    assert plan.writes == []
    assert len(plan.problems) == 3


def test_no_node_or_no_memory_or_empty_strategy_writes_nothing() -> None:
    s = _strategy(minFreeKbytesFactor=88)
    assert _writes(s, None) == {}
    assert _writes(s, 0) == {}
    assert _writes(_strategy()) == {}
    assert _writes(None) == {}


def test_optional_knobs() -> None:
    assert _writes(_strategy(schedIdleSaverWmark=5000000)) == {SCHED_IDLE_SAVER_WMARK: "5000000"}
    assert _writes(_strategy(schedGroupIdentityEnabled=0)) == {SCHED_GROUP_IDENTITY: "0"}
    assert _writes(_strategy(pageCacheLimitEnabled=1)) == {PAGECACHE_LIMIT: "1"}
    # a kernel without the file: not written
    plan = plan_system_config(SysInputs(_strategy(schedGroupIdentityEnabled=1), NODE_512GI, frozenset()))
    assert plan.writes == []


def test_sched_features() -> None:
    s = _strategy(schedFeatures={"ID_ABSOLUTE_EXPEL": True})
    plan = plan_system_config(SysInputs(s, NODE_512GI, ALL, parse_sched_features("NO_ID_ABSOLUTE_EXPEL")))
    assert [(w.target, w.value, w.cacheable) for w in plan.writes] == [
        (SCHED_FEATURES, "ID_ABSOLUTE_EXPEL\n", False)
    ]
    s = _strategy(schedFeatures={"ID_EXPELLER_SHARE_CORE": False})
    plan = plan_system_config(
        SysInputs(s, NODE_512GI, ALL, parse_sched_features("ID_EXPELLER_SHARE_CORE FOO"))
    )
    assert [w.value for w in plan.writes] == ["NO_ID_EXPELLER_SHARE_CORE\n"]
    # already in the wanted state: nothing
    plan = plan_system_config(
        SysInputs(s, NODE_512GI, ALL, parse_sched_features("NO_ID_EXPELLER_SHARE_CORE"))
    )
    assert plan.writes == []
    assert parse_sched_features("A NO_B\n") == {"A": True, "B": False}


def test_removed_field_restores_the_original_value() -> None:
    originals = {WATERMARK_SCALE_FACTOR: "150", MIN_FREE_KBYTES: "5368709"}
    got = _writes(_strategy(minFreeKbytesFactor=88), originals=originals)
    assert got == {MIN_FREE_KBYTES: "4724464", WATERMARK_SCALE_FACTOR: "150"}
    # an invalid value never restores: the file stays as it is
    got = _writes(_strategy(watermarkScaleFactor=5), originals=originals)
    assert got == {MIN_FREE_KBYTES: "5368709"}


async def _round(tmp_path: object, restore: bool) -> tuple[str, str]:
    """Factor 88 + wsf 99, then the wsf field removed: (min_free_kbytes, watermark_scale_factor) after."""
    from pathlib import Path
    from types import MappingProxyType

    from koordqos.config import build_config
    from koordqos.decisions import DecisionLog
    from koordqos.model.node import NodeInfo
    from koordqos.state import NodeState
    from koordqos.strategies.sysconfig import SystemConfigStrategy
    from koordqos.testing.nodefs import SyntheticNode
    from koordqos.testing.strategyenv import strategy_env

    node = SyntheticNode(Path(str(tmp_path)))
    node.add_sysctls()
    cfg = build_config(
        {
            "paths": {"proc_root": node.proc_root, "sys_root": node.sys_root},
            "qos": {"system_config_restore": restore},
        }
    )
    decisions = DecisionLog()
    env = strategy_env(node.layout, decisions, config=cfg)
    strategy = SystemConfigStrategy()
    n = NodeInfo(name="n", capacity={"memory": NODE_512GI}, allocatable={"memory": NODE_512GI})
    for system in ({"minFreeKbytesFactor": 88, "watermarkScaleFactor": 99}, {"minFreeKbytesFactor": 88}):
        slo = parse_nodeslo({"spec": {"systemStrategy": system}})
        await strategy.run_once(NodeState(pods=MappingProxyType({}), node=n, node_slo=slo), env)
    vm = node.proc_root / "sys" / "vm"
    return (vm / "min_free_kbytes").read_text().strip(), (vm / "watermark_scale_factor").read_text().strip()


async def test_restore_flag(tmp_path: object) -> None:
    from pathlib import Path

    assert await _round(Path(str(tmp_path)) / "a", restore=True) == ("4724464", "150")
    # --system-config-restore=false: koordlet leaves the last written value
    assert await _round(Path(str(tmp_path)) / "b", restore=False) == ("4724464", "99")

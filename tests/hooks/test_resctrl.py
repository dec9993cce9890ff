"""Resctrl hook (docs/behaviour-runtime-hooks.md, "Resctrl hook"): the pod's group as the container's NRI RDT
class."""

from __future__ import annotations

import json
from pathlib import Path

from koordqos.hooks.context import ContainerContext, ContainerRequest, Stage
from koordqos.hooks.registry import HOOKS
from koordqos.hooks.resctrl import SKIPPED, Resctrl
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.convert import fill_adjustment

ANN = {"node.koordinator.sh/resctrl": json.dumps({"llc": {"schemata": {"range": [0, 50]}}})}


def ctx(annotations: dict[str, str], sandbox: bool = False) -> ContainerContext:
    return ContainerContext(
        ContainerRequest(pod_uid="uid-1", container_name="c", pod_annotations=annotations, sandbox=sandbox)
    )


def test_registered_with_its_gate() -> None:
    spec = next(h for h in HOOKS if h.name == "Resctrl")
    assert spec.gate == "Resctrl"
    assert Stage.PRE_CREATE_CONTAINER in Resctrl(None).stage_hooks()


def test_class_set_once_the_group_exists_and_filled_into_the_adjustment(tmp_path: Path) -> None:
    hook = Resctrl(tmp_path)
    before = SKIPPED.labels("group-not-ready")._value.get()
    c = ctx(ANN)
    hook.set_rdt_class(c)
    assert c.response.rdt_class is None  # no group yet: runc would refuse the container
    assert SKIPPED.labels("group-not-ready")._value.get() == before + 1
    (tmp_path / "koordlet-uid-1").mkdir()
    c = ctx(ANN)
    hook.set_rdt_class(c)
    assert c.response.rdt_class == "koordlet-uid-1"
    adjust = api.ContainerAdjustment()
    fill_adjustment(adjust, c)
    assert adjust.linux.resources.rdt_class.value == "koordlet-uid-1"


def test_no_annotation_sandbox_bad_annotation_or_no_resctrl(tmp_path: Path) -> None:
    (tmp_path / "koordlet-uid-1").mkdir()
    hook = Resctrl(tmp_path)
    for c in (ctx({}), ctx(ANN, sandbox=True), ctx({"node.koordinator.sh/resctrl": "{"})):
        hook.set_rdt_class(c)
        assert c.response.rdt_class is None
    c = ctx(ANN)
    Resctrl(None).set_rdt_class(c)
    assert c.response.rdt_class is None
    # a symlinked group dir is not trusted
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "koordlet-uid-2").symlink_to(tmp_path / "elsewhere")
    c = ContainerContext(ContainerRequest(pod_uid="uid-2", container_name="c", pod_annotations=ANN))
    hook.set_rdt_class(c)
    assert c.response.rdt_class is None

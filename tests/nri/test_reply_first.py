"""The reply first: a container call's bookkeeping (its decision record, the request's and the hooks' timings)
is done after its reply is written, in the same read callback, and none of it is lost."""

from __future__ import annotations

from pathlib import Path

from koordqos import observability as obs
from koordqos.bus import EventBus
from koordqos.cgroups.executor import CgroupExecutor
from koordqos.config import NRISettings
from koordqos.decisions import DecisionLog
from koordqos.hooks.core import HookCore
from koordqos.hooks.runtime import RuntimeHooks
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.connection import NRIConnection
from koordqos.nri.convert import NRIHooks
from koordqos.nri.mux import MuxDecoder, frames_for
from koordqos.nri.plugin import NRIPlugin
from koordqos.nri.session import PLUGIN_SERVICE, PluginSession
from koordqos.nri.ttrpc import MessageType, TtrpcDecoder, decode_response, encode_message, encode_request

from .test_convert import be_pod, ctr, make_node


def _request(stream: int, method: str, payload: bytes) -> bytes:
    env = encode_request(PLUGIN_SERVICE, method, payload, 2_000_000_000)
    return b"".join(frames_for(1, encode_message(stream, MessageType.REQUEST, env)))


def _quota(reply: bytes) -> int:
    """The CPU quota a written CreateContainer reply adjusts."""
    (_, frame), *more = MuxDecoder().feed(reply)
    (msg,) = TtrpcDecoder().feed(frame + b"".join(f for _, f in more))
    resp = api.CreateContainerResponse.FromString(decode_response(msg.data).payload)
    return int(resp.adjust.linux.resources.cpu.quota.value)


def _sample(name: str, labels: dict[str, str]) -> float:
    return obs.REGISTRY.get_sample_value(name, labels) or 0.0


def _bookkeeping(decisions: DecisionLog) -> tuple[int, float, float, float]:
    """What a CreateContainer's bookkeeping adds to: its decision records, the request counter, the call's
    and the batch-resource hook's timing counts."""
    return (
        len(decisions.recent()),
        _sample("koordqos_nri_requests_total", {"method": "CreateContainer", "outcome": "ok"}),
        _sample("koordqos_nri_request_seconds_count", {"method": "CreateContainer"}),
        _sample(
            "koordqos_runtime_hook_seconds_count",
            {"hook": "BatchResource", "stage": "PreCreateContainer"},
        ),
    )


async def test_a_create_container_reply_is_written_before_its_bookkeeping_and_none_is_lost(
    tmp_path: Path,
) -> None:
    node = make_node(tmp_path)
    decisions = DecisionLog()
    hooks = NRIHooks(HookCore(RuntimeHooks(), CgroupExecutor(node.layout, decisions), decisions), node.layout)
    plugin = NRIPlugin(EventBus(), NRISettings(socket=tmp_path / "s"), handler=hooks)
    session = PluginSession(plugin)
    conn = NRIConnection(session.handle)
    at_write: list[tuple[int, float, float, float]] = []
    replies: list[bytes] = []

    class Sink:
        def writelines(self, frames: list[bytes]) -> None:
            at_write.append(_bookkeeping(decisions))
            replies.append(b"".join(frames))

        def is_closing(self) -> bool:
            return False

    conn._transport = Sink()  # type: ignore[assignment]
    before = _bookkeeping(decisions)
    payload = api.CreateContainerRequest(
        pod=be_pod(), container=ctr(api.CONTAINER_CREATED)
    ).SerializeToString()
    conn.data_received(_request(1, "CreateContainer", payload) + _request(3, "CreateContainer", payload))

    assert conn.error is None
    assert [_quota(r) for r in replies] == [50000, 50000]  # both answered, with the BE quota
    # at each write: the calls before it are booked, the one being answered is not yet
    records, requests, call_timings, hook_timings = before
    assert at_write == [
        (records, requests, call_timings, hook_timings),
        (records + 1, requests + 1, call_timings + 1, hook_timings + 1),
    ]
    # after the read callback: both calls booked, nothing lost
    assert _bookkeeping(decisions) == (records + 2, requests + 2, call_timings + 2, hook_timings + 2)
    last = decisions.recent()[-1]
    assert (last.action, last.reason, last.target) == ("nri-adjust", "CreateContainer", "ns/p/c")
    assert "quota=50000" in str(last.new)

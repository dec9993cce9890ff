"""The NRI protocol as the mock runtime enforces it: service names, event tables, the Go reader's frame rule
(docs/behaviour-nri.md, "Frames the runtime can read") and the errors a runtime call ends in."""

from __future__ import annotations

from koordqos.errors import KoordQoSError, ProtocolError
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.mux import GO_READ_BUFFER
from koordqos.nri.ttrpc import HEADER_SIZE, TtrpcDecoder

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"

# Events without a StateChange fallback: answering UNIMPLEMENTED there fails the operation.
NO_FALLBACK = {"CreateContainer", "UpdateContainer", "StopContainer", "UpdatePodSandbox"}
EVENT_OF_METHOD = {
    "RunPodSandbox": api.RUN_POD_SANDBOX,
    "StopPodSandbox": api.STOP_POD_SANDBOX,
    "RemovePodSandbox": api.REMOVE_POD_SANDBOX,
    "CreateContainer": api.CREATE_CONTAINER,
    "PostCreateContainer": api.POST_CREATE_CONTAINER,
    "StartContainer": api.START_CONTAINER,
    "PostStartContainer": api.POST_START_CONTAINER,
    "UpdateContainer": api.UPDATE_CONTAINER,
    "PostUpdateContainer": api.POST_UPDATE_CONTAINER,
    "StopContainer": api.STOP_CONTAINER,
    "RemoveContainer": api.REMOVE_CONTAINER,
}


class RuntimeCallError(KoordQoSError):
    """The plugin answered a runtime call with an error status (the runtime operation fails)."""

    def __init__(self, method: str, code: int, message: str) -> None:
        super().__init__(f"NRI {method} failed: {message} (code {code})")
        self.method = method
        self.code = code
        self.message = message


class PluginDroppedError(KoordQoSError):
    """The runtime dropped the plugin (timeout, protocol violation, …) during a call."""


def go_frame_check(conn_id: int, payload: bytes, decoder: TtrpcDecoder) -> None:
    """Raise ProtocolError for a frame the Go mux + ttrpc reader could not take (docs/behaviour-nri.md)."""
    if decoder.buffered == 0:
        if len(payload) > GO_READ_BUFFER:
            raise ProtocolError(
                f"frame of {len(payload)} bytes on conn {conn_id} arrived between messages "
                f"(> {GO_READ_BUFFER}: the Go reader fails with ENOMEM)"
            )
        if len(payload) >= HEADER_SIZE:
            total = HEADER_SIZE + int.from_bytes(payload[:4], "big")
            if len(payload) > total:
                raise ProtocolError(f"frame on conn {conn_id} packs more than one ttrpc message")
        return
    remaining = decoder.remaining()
    if remaining is None:
        if len(payload) > GO_READ_BUFFER:
            raise ProtocolError(f"frame of {len(payload)} bytes on conn {conn_id} in the middle of a header")
    elif len(payload) > remaining:
        raise ProtocolError(f"frame on conn {conn_id} packs the tail of one ttrpc message with the next")

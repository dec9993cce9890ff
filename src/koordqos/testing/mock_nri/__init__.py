"""MockRuntime: the runtime side of NRI (containerd's pkg/adaptation) on a real unix socket.

It listens like a runtime, accepts a plugin, serves the runtime service on conn 2 (RegisterPlugin,
UpdateContainers), sends Configure (before the RegisterPlugin reply, as the real runtime does) and
Synchronize (chunked with `more` when large or when asked), drives pod and container lifecycle events
(dedicated RPCs with the UNIMPLEMENTED → StateChange fallback, or StateChange only as on NRI < v0.12), and
records the replies. It enforces the rules that make a real runtime drop a plugin: the registration timeout,
the request timeout, the Go reader's frame-size rule (> 4096 bytes between messages, or two messages in
one frame), odd increasing stream ids, a valid event mask and the `more` echo. A dropped plugin has its
socket closed and `link.drop_reason` says why.

Usable from tests (in-process), from benchmarks in another process (`python -m koordqos.testing.mock_nri`)
and from a demo. Modules: `protocol` (service names, event tables, the Go reader's frame rule, call
errors), `link` (what the runtime knows of one plugin), `runtime` (MockRuntime: the socket server and the
event driver), `samples` (realistic pods and containers), `__main__` (the command line).
"""

"""Test tooling that is not part of the product wheel: the fake Kubernetes API server and its object
builders, the agent as a subprocess (`agentproc`: the one `free_port`), the protocol fuzzer, the heap tracer
and the Go NRI peer builder. `tests/` and `bench/` import it as `tests.support` (pytest puts the repository
root on `sys.path`; `bench/_common.py` does the same for the benchmarks). What the demo and local trials
need (mock runtime, synthetic node roots, scratch cgroups) stays in `koordqos.testing`."""

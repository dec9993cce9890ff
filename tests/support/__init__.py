"""Test tooling that is not part of the product wheel: the fake Kubernetes API server and its object builders,
the agent as a subprocess (`agentproc`: the cluster-mode command line over `koordqos.testing.agentrunner`,
which starts the agent and has the one `free_port`), the protocol fuzzer, the heap tracer and the Go NRI
peer builder. `tests/` and `bench/` import it as `tests.support` (pytest puts the repository root on
`sys.path`; `bench/_common.py` does the same for the benchmarks). What the demo and local trials need (mock
runtime, synthetic node roots, scratch cgroups, the agent subprocess helper) stays in `koordqos.testing`."""

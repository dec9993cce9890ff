"""`python -m koordqos demo`: watch CPU suppress protect a latency-sensitive pod from best-effort burners.

Modules, one job each:
  options    the demo's flags and their typed form
  workload   the LS latency probes and the BE burners (child processes)
  exitguard  cleanup that runs once on normal exit, Ctrl-C, SIGTERM and crashes
  cgtree     the scratch pod tree on the real cgroup hierarchy (v1 or v2)
  nsexec     launcher that runs the agent with the scratch tree bind-mounted as its cgroup root
  nripods    the demo's pods and containers as the mock NRI runtime reports them
  agentproc  the agent subprocess: command line, NodeSLO file, readiness, decisions, own CPU
  sampler    time series (latency, BE/LS CPU, quota) and per-phase figures
  synthetic  the synthetic node: simulated usage instead of real processes (`--synthetic`)
  runner     the phases (LS alone → BE without the agent → BE with the agent)
  live       the live terminal view (rich)
  report     the JSON report and the PNG chart (matplotlib)
  main       entry point: checks, backend choice, exit codes

`rich` and `matplotlib` come with the `demo` extra (`pip install koordqos[demo]`); they are imported only by
`live` and `report`.
"""

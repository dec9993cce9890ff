"""koordqos.report: what the agent reports to Koordinator's control plane (docs/reporting.md).

Planners, pure: `history` (the samples, bounded), `nodemetric` (NodeMetric status), `nrt` + `pools` +
`kubelet` (NodeResourceTopology), `batch` (koord-manager's batch formula, for tests and the standalone
mode). The kube actuators that write the objects live in `koordqos.kube.reportwriters`.
"""

"""HTTP endpoints: /healthz, /readyz, /metrics and (with --debug-endpoints) /debug/*.

`HTTPServer(settings, view)` reads the agent through `AgentView` (readiness, status, decisions, state).
"""

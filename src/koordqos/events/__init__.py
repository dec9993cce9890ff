"""Events (`events/types.py`) and the bus that carries them to strategies, hooks and the reconciler
(`events/bus.py`).

Import from the modules, not from this package: `state.py` imports `events/types.py`, and `events/bus.py`
imports `state.py`, so this `__init__` must import neither (importing `koordqos.state` first would otherwise
run into a half-initialised `koordqos.state`).
"""

"""The agent process's machinery, apart from the composer (`agent.py`): component supervision
(`supervisor`), the bounded exit (`exitdeadline`), the loop-lag probe (`looplag`) and the garbage-collector
policy (`gcpolicy`). Import from the modules; this `__init__` imports nothing."""

"""koordqos: the QoS layer of Koordinator's node agent, on one asyncio event loop."""

__version__ = "0.1.0"

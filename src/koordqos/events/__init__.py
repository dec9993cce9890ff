"""What happened: the event types the bus carries (`events/types.py`) and the runtime records NodeState
holds (`events/records.py`). Pure data: the bus is `koordqos.bus`, the reducer `koordqos.state`; this
package imports neither (it sits below both)."""

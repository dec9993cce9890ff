"""CPU burst strategy tests (qos-manager.md §2.4)."""

"""Pure data: pods, nodes, NodeSLO and quantities. No I/O."""

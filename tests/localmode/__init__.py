"""Local mode (no cluster): pods and their containers from NRI, measured and handled like API pods."""

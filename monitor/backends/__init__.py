"""Card discovery backends behind one interface: NVML (real cards) and simulated (cards from a file)."""

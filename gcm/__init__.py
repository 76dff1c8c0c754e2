"""Global Configuration Manager: leader election, control API, placement."""

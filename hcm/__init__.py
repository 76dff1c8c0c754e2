"""Host Configuration Manager: registers a host and supervises its exchanges."""

"""Every benchmark end to end in its tiny mode, and the harness and the report they share."""

"""The GPU's checks: make gpu-check's prepared run, its profile, and the host's waits for the device per token."""

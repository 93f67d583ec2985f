"""The load harness's probes of a public host: faults, the upload flood, bad input, the fuzzed router loader, the public-host checks."""

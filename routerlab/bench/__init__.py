"""Measuring: decode speed and the cost model, the trade-off sweep, the load/fault harness, the results report.

Builds on `core`, `tuning` and (the load harness, which drives the real app) `ui`.
"""

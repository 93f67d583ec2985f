"""Making and judging routers: data, the shared teacher-forced forward, training, checkpoints, evaluation.

Builds on `routerlab.core`; knows nothing about benchmarks or the UI.
"""

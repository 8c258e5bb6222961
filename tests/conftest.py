"""Fixtures for the whole suite, and the skip guard (tests/skip_guard.py).

The real default model is found, or fetched and converted on first use, through
``shared.worker.model_fetch.resolve_model``, which honours ``TWINSERVE_CACHE`` (else
``~/.cache/twinserve``): a test that needs the model or its tokenizer asks for
``default_model_dir`` and never skips for want of a cache.
"""
from __future__ import annotations

import pytest

from tests.skip_guard import (  # noqa: F401 - hooks, registered by being in this module
    pytest_collection_modifyitems,
    pytest_collectreport,
    pytest_configure,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)


@pytest.fixture(scope="session")
def default_model_dir() -> str:
    """The default model's HF folder (SmolLM2-135M-Instruct), fetched + converted if missing."""
    from shared.worker.model_fetch import resolve_model

    return str(resolve_model(None))


@pytest.fixture(scope="session")
def default_tokenizer_json(default_model_dir: str) -> str:
    return default_model_dir + "/tokenizer.json"

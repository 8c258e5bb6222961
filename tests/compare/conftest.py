from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def default_model_dir() -> str:
    from shared.model_fetch import resolve_model

    return str(resolve_model(None))


@pytest.fixture(scope="session")
def default_tokenizer_json(default_model_dir: str) -> str:
    return default_model_dir + "/tokenizer.json"

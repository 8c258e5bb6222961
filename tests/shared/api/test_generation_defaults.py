"""--generation-config: the model's sampling defaults fill only the fields a request omits."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from shared.api import build_app
from shared.api.generation_defaults import load_generation_defaults
from shared.config import ServerConfig
from tests.shared.api.api_helpers import CHAT, COMPLETIONS, HELLO
from tests.shared.api.fake_engine import FakeEngine

GEN = {"temperature": 0.3, "top_k": 7, "top_p": 0.9, "repetition_penalty": 1.1,
       "max_new_tokens": 9, "do_sample": True, "eos_token_id": 2}


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    (tmp_path / "generation_config.json").write_text(json.dumps(GEN))
    return tmp_path


def _params(mode: str, bodies: list[tuple[str, dict]]):
    engine = FakeEngine()
    app = build_app(engine, ServerConfig(engine="v0", generation_config=mode))

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=10) as c:
            for path, body in bodies:
                assert (await c.post(path, json=body)).status_code == 200
    asyncio.run(main())
    return [p for _, p in engine.calls]


def test_defaults_fill_what_the_request_omits(folder: Path) -> None:
    chat, completion = _params(str(folder), [(CHAT, {"messages": HELLO}),
                                             (COMPLETIONS, {"prompt": "x"})])
    for p in (chat, completion):
        assert (p.temperature, p.top_k, p.top_p, p.repetition_penalty, p.max_tokens) == \
            (0.3, 7, 0.9, 1.1, 9)


def test_the_request_wins(folder: Path) -> None:
    [p] = _params(str(folder), [(CHAT, {"messages": HELLO, "temperature": 0, "top_k": 3,
                                        "max_tokens": 4})])
    assert (p.temperature, p.top_k, p.max_tokens, p.top_p) == (0.0, 3, 4, 0.9)


def test_none_keeps_openais_defaults(folder: Path) -> None:
    [chat, completion] = _params("none", [(CHAT, {"messages": HELLO}), (COMPLETIONS, {"prompt": "x"})])
    assert (chat.temperature, chat.top_k, completion.max_tokens) == (1.0, 0, 16)


def test_loading(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    assert load_generation_defaults("auto", folder) == {
        "temperature": 0.3, "top_k": 7, "top_p": 0.9, "repetition_penalty": 1.1, "max_tokens": 9}
    assert load_generation_defaults("auto", tmp_path_factory.mktemp("bare")) == {}
    with pytest.raises(ValueError, match="no generation_config.json"):
        load_generation_defaults(str(tmp_path_factory.mktemp("empty")), folder)

"""--tensor-parallel-size 3 on a real server with the default model (9 heads, 3 KV heads):
greedy tokens equal one process's, logprobs within 1e-3, and SIGTERM leaves no worker."""
from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from tests.engine_v1.test_data_parallel import EXACT, PROMPTS, _assert_gone
from tests.server_util import Server, start_server, stop_server
from tests.shared.api.api_helpers import COMPLETIONS


def _complete(server: Server) -> list[tuple[list[str], list[float]]]:
    """Four greedy completions in one batch request: (tokens, logprobs) of each."""
    with server.client() as c:
        resp = c.post(COMPLETIONS, json={"prompt": PROMPTS[:4], "max_tokens": 8, "temperature": 0,
                                         "ignore_eos": True, "logprobs": 0})
    assert resp.status_code == 200, resp.text
    choices = sorted(resp.json()["choices"], key=lambda ch: ch["index"])
    return [(ch["logprobs"]["tokens"], ch["logprobs"]["token_logprobs"]) for ch in choices]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory,
                default_model_dir: str) -> list[tuple[list[str], list[float]]]:
    """TP=1's answers (v0 and v1 answer identically: tests/engine_v1/test_equivalence.py)."""
    one = start_server("v1", tmp_path_factory.mktemp("tp1") / "tp1.log", *EXACT)
    try:
        return _complete(one)
    finally:
        stop_server(one)


@pytest.mark.parametrize("engine", ["v1", "v0"])
def test_tp3_matches_one_process_and_sigterm_leaves_no_worker(
        tmp_path: Path, engine: str, one_process: list[tuple[list[str], list[float]]]) -> None:
    server = start_server(engine, tmp_path / "tp3.log", "--tensor-parallel-size", "3", *EXACT)
    try:
        sharded = _complete(server)
        workers = [p for p in psutil.Process(server.pid).children(recursive=True)
                   if "shared.worker.distributed.worker" in " ".join(p.cmdline())]
        assert len(workers) == 2
    finally:
        code = stop_server(server)
    assert code == 0
    _assert_gone([p.pid for p in workers])
    assert [t for t, _ in sharded] == [t for t, _ in one_process]
    for (_, lps), (_, ref) in zip(sharded, one_process):
        assert max(abs(a - b) for a, b in zip(lps, ref)) < 1e-3


def test_data_and_tensor_parallel_together_are_refused() -> None:
    from shared.cli.main import main

    with pytest.raises(SystemExit, match="cannot both be > 1"):
        main(["serve", "--data-parallel-size", "2", "--tensor-parallel-size", "3"])

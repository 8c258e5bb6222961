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


@pytest.mark.parametrize("engine", ["v1", "v0"])
def test_tp3_matches_one_process_and_sigterm_leaves_no_worker(tmp_path: Path, engine: str,
                                                             default_model_dir: str) -> None:
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
    one = start_server(engine, tmp_path / "tp1.log", *EXACT)
    try:
        expected = _complete(one)
    finally:
        stop_server(one)
    assert [t for t, _ in sharded] == [t for t, _ in expected]
    for (_, lps), (_, ref) in zip(sharded, expected):
        assert max(abs(a - b) for a, b in zip(lps, ref)) < 1e-3


def test_data_and_tensor_parallel_together_are_refused() -> None:
    from shared.cli.main import main

    with pytest.raises(SystemExit, match="cannot both be > 1"):
        main(["serve", "--data-parallel-size", "2", "--tensor-parallel-size", "3"])

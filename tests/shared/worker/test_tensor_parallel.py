"""Tensor parallelism on CPU (gloo, worker processes on loopback): the shard layout, TP=2
against TP=1 on tiny random models of each family, refusals, and a rank that fails to start."""
from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest
import torch

from shared.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from shared.engine_core import EngineCore
from shared.messages import EngineCoreRequest, SamplingParams
from shared.worker.distributed.group import Rendezvous
from shared.worker.distributed.sharding import check_divides, shard_arch, shard_tensor
from shared.worker.models import ArchConfig
from shared.worker.step_inputs import StepArrays, decode_step, encode_step
from tests.shared.worker.test_model import FAMILIES, make_tiny, tokens

VOCAB = 255    # odd: the last vocabulary shard is padded


def _config(folder: Path, tp: int, **parallel: int | bool) -> EngineConfig:
    # Small steps, so prompts are chunked and steps mix prefill chunks with decodes.
    return EngineConfig(
        model=ModelConfig(model=str(folder), dtype="float32", quantization="none", num_threads=1),
        cache=CacheConfig(block_size=4, num_blocks=96),
        scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16),
        parallel=ParallelConfig(tensor_parallel_size=tp, **parallel))


def _run(folder: Path, tp: int, **parallel: int | bool) -> tuple[list[torch.Tensor], dict[str, list]]:
    """Every step's logits, and each request's output tokens and prompt logprobs."""
    core = EngineCore(_config(folder, tp, **parallel), folder)
    try:
        for i, n in enumerate((13, 21, 6)):
            sp = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True,
                                prompt_logprobs=2 if i == 1 else None)
            core.add_request(EngineCoreRequest(f"r{i}", tokens(n, VOCAB, i), sp,
                                               None, time.time()))
        steps, outputs = [], {}
        while core.has_unfinished_requests():
            batch = core.begin_step()
            assert batch is not None
            logits = core.run_forward(batch)
            steps.append(logits.clone())
            for out in core.finish_step(batch, logits).outputs:
                outputs.setdefault(out.request_id, []).append(
                    (out.new_token_ids, out.prompt_logprobs))
        return steps, outputs
    finally:
        core.close()


@pytest.mark.parametrize(("family", "shm"), [(f, True) for f in FAMILIES] + [("llama", False)])
def test_tp2_logits_equal_tp1(tmp_path: Path, family: str, shm: bool) -> None:
    """Shared-memory collectives for each family; gloo's own for one."""
    folder, _ = make_tiny(tmp_path, family, seed=21, tie_word_embeddings=family == "llama",
                          vocab_size=VOCAB)
    one_steps, one_out = _run(folder, 1)
    two_steps, two_out = _run(folder, 2, tensor_parallel_shared_memory=shm)
    assert len(two_steps) == len(one_steps) > 5
    for a, b in zip(one_steps, two_steps):
        assert a.shape == b.shape and a.shape[1] == VOCAB
        assert (a - b).abs().max().item() < 1e-4
    assert [t for t, _ in two_out["r0"]] == [t for t, _ in one_out["r0"]]
    scored = [(lp.token_id, lp.logprob, lp.top_ids) for t, p in two_out["r1"] if p for lp in p if lp]
    expected = [(lp.token_id, lp.logprob, lp.top_ids) for t, p in one_out["r1"] if p for lp in p if lp]
    assert len(scored) == 20 and [s[0] for s in scored] == [e[0] for e in expected]
    assert max(abs(s[1] - e[1]) for s, e in zip(scored, expected)) < 1e-4


def test_shards_put_back_together_are_the_checkpoint() -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(8, 6, generator=gen)
    cols = [shard_tensor("model.layers.0.self_attn.k_proj.weight", w, r, 2) for r in range(2)]
    assert torch.equal(torch.cat(cols, 0), w) and cols[0].shape == (4, 6)
    rows = [shard_tensor("model.layers.0.mlp.down_proj.weight", w, r, 3) for r in range(3)]
    assert torch.equal(torch.cat(rows, 1), w) and rows[0].shape == (8, 2)
    bias = torch.randn(8, generator=gen)
    biases = [shard_tensor("model.layers.0.self_attn.o_proj.bias", bias, r, 2) for r in range(2)]
    assert torch.equal(biases[0] + biases[1], bias)       # added once, after the all-reduce
    vocab = [shard_tensor("lm_head.weight", w[:7], r, 2) for r in range(2)]
    assert [v.shape[0] for v in vocab] == [4, 4] and torch.equal(torch.cat(vocab)[:7], w[:7])
    assert not vocab[1][3].any()                           # the padding row scores nothing
    norm = torch.randn(6, generator=gen)
    assert shard_tensor("model.layers.0.input_layernorm.weight", norm, 1, 2) is norm


def test_a_size_that_does_not_divide_the_heads_is_refused(default_model_dir: str) -> None:
    arch = ArchConfig.from_folder(Path(default_model_dir))     # 9 heads, 3 KV heads
    with pytest.raises(ValueError, match=r"9 attention heads and 3 KV heads.*fit: \[1, 3\]"):
        check_divides(arch, 2)
    assert shard_arch(arch, 3).num_attention_heads == 3
    before = _children()
    with pytest.raises(ValueError, match="does not divide"):
        EngineCore(EngineConfig(parallel=ParallelConfig(tensor_parallel_size=2)),
                   Path(default_model_dir))
    assert _children() == before                           # refused before any worker started


def test_step_inputs_survive_the_wire() -> None:
    import numpy as np

    a = StepArrays(np.arange(5, dtype=np.int64), np.arange(5, dtype=np.int64) + 3,
                   np.arange(5, dtype=np.int64) * 2, np.array([0, 3, 5], dtype=np.int32),
                   np.array([7, 9], dtype=np.int32), np.arange(6, dtype=np.int32).reshape(2, 3),
                   np.array([2, 4], dtype=np.int64), [3, 2], [(1, 2)], [])
    b = decode_step(encode_step(a))
    for name in ("input_ids", "positions", "slot_mapping", "query_start_loc", "seq_lens",
                 "block_tables", "logits_indices"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    assert b.query_lens == [3, 2] and b.block_copies == [(1, 2)] and b.block_tables.flags.writeable


def test_a_rank_that_fails_to_start_is_named_and_nothing_is_left(tmp_path: Path) -> None:
    folder, _ = make_tiny(tmp_path, "llama", seed=22)
    before = _children()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 failed before 'loaded'.*injected start-up"):
        EngineCore(_config(folder, 2, debug_fail_tp_rank=1), folder)
    assert time.monotonic() - t0 < 60                      # an error, not a hang
    deadline = time.monotonic() + 5
    while _children() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _children() - before
    _run(folder, 2)     # and the next start in this process forms a fresh group


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_rendezvous_reads_torchrun_variables() -> None:
    rdv = Rendezvous.from_env({"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1",
                               "MASTER_PORT": "29500"})
    assert (rdv.rank, rdv.world_size, rdv.master_addr, rdv.master_port) == (2, 4, "10.0.0.1", 29500)
    assert not rdv.is_loopback
    assert rdv.env(1) == {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                          "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def test_a_rank_started_by_hand_joins_as_on_another_node(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The two-node recipe on loopback: rank 0 starts only itself, rank 1 is launched with
    torchrun's variables alone, and the pair computes what one process does."""
    import socket
    import subprocess
    import sys

    folder, _ = make_tiny(tmp_path, "qwen2", seed=23)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2"}
    worker = subprocess.Popen([sys.executable, "-m", "shared.worker.distributed.worker",
                               "--model", str(folder)], env=env)
    try:
        steps, _ = _run(folder, 2, tensor_parallel_local_size=1)
        assert worker.wait(30) == 0                        # left on rank 0's stop signal
        one_steps, _ = _run(folder, 1)
        assert max((a - b).abs().max().item() for a, b in zip(steps, one_steps)) < 1e-4
    finally:
        worker.kill()


def test_a_worker_killed_while_serving_fails_the_step_and_nothing_listens_outside(tmp_path: Path) -> None:
    folder, _ = make_tiny(tmp_path, "llama", seed=24)
    core = EngineCore(_config(folder, 2), folder)
    try:
        sp = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
        core.add_request(EngineCoreRequest("a", tokens(9, VOCAB, 0), sp, None, time.time()))
        core.step()
        worker = core.model_runner.launcher.procs[1]
        # The rendezvous store and gloo's pairs listen on loopback only.
        listening = [c.laddr.ip for pid in (os.getpid(), worker.pid)
                     for c in psutil.Process(pid).net_connections("inet") if c.status == "LISTEN"]
        assert listening and set(listening) == {"127.0.0.1"}, listening
        worker.kill()
        worker.wait()
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="rank 1 exited with code -9"):
            core.step()
        assert time.monotonic() - t0 < 30
    finally:
        core.close()

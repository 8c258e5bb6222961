"""Decode CUDA graphs: padding rows stay in the scratch block, replays match the eager model.

On CPU the graph is replaced by a re-run of the same forward over the static buffers (what a
replay executes), so the padding, static metadata and upper-bound plan are tested under the
interpreter; the ``cuda`` test captures real graphs.

A padded batch of 4 and the eager batch of 3 run GEMMs of different shapes, which CPU and GPU
BLAS kernels need not sum in the same order: float results (hidden states, the K/V rows of real
slots) are compared within a per-dtype tolerance, never bit for bit. Only slots nobody wrote are
compared exactly, against their content before the run.
"""
from __future__ import annotations

import os

import pytest
import torch

from shared.worker.attention.metadata import AttentionMetadata
from shared.worker.cuda_graphs import DecodeGraphs, capture_sizes
from shared.worker.model_loader import allocate_kv_caches
from tests.kernels.helpers import tiny_model

pytest.importorskip("triton")

BLOCK_SIZE, NUM_BLOCKS, MAX_LEN = 4, 12, 32   # block NUM_BLOCKS is the scratch block
PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18]]
# Graph replay against eager, per dtype (the padded batch has a different GEMM shape).
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}


class _EagerReplay:
    """Stands in for a captured graph: a replay runs the captured forward again."""

    def __init__(self, graphs: DecodeGraphs, b: int) -> None:
        self.graphs, self.b = graphs, b

    def replay(self) -> None:
        self.graphs.outputs[self.b] = self.graphs._forward(self.b)


class EagerGraphs(DecodeGraphs):
    @torch.inference_mode()
    def capture(self) -> None:
        for b in self.sizes:
            self.graphs[b] = _EagerReplay(self, b)   # type: ignore[assignment]


def _meta(slots: list[int], q_lens: list[int], seq_lens: list[int], tables: list[list[int]],
          device: torch.device) -> AttentionMetadata:
    qsl = [0]
    for q in q_lens:
        qsl.append(qsl[-1] + q)
    return AttentionMetadata(
        torch.tensor(slots, device=device), torch.tensor(qsl, dtype=torch.int32, device=device),
        torch.tensor(seq_lens, dtype=torch.int32, device=device),
        torch.tensor(tables, dtype=torch.int32, device=device), BLOCK_SIZE, q_lens, seq_lens)


def _decode_steps(model, caches, graphs: DecodeGraphs | None, device: torch.device,  # noqa: ANN001
                  steps: int = 3) -> tuple[list[torch.Tensor], list[int]]:
    """Prefill PROMPTS eagerly, then decode ``steps`` tokens each (through ``graphs`` if given).

    Returns the hidden states of each decode step and every cache slot the real tokens wrote.
    """
    tables = [[1, 7, 3], [9, 2, 0], [4, 10, 6, 5]]   # shuffled, with room for the decode tokens
    seqs = [list(p) for p in PROMPTS]
    slot = lambda s, p: tables[s][p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE  # noqa: E731
    ids = [t for p in seqs for t in p]
    pos = [i for p in seqs for i in range(len(p))]
    slots = [slot(s, i) for s, p in enumerate(seqs) for i in range(len(p))]
    written = list(slots)
    width = max(map(len, tables))
    padded = [t + [0] * (width - len(t)) for t in tables]
    with torch.inference_mode():
        meta = _meta(slots, [len(p) for p in seqs], [len(p) for p in seqs], padded, device)
        model(torch.tensor(ids, device=device), torch.tensor(pos, device=device), meta, caches)
        out = []
        for step in range(steps):
            live = [0, 2] if step == 1 else [0, 1, 2]    # a smaller batch reuses padded rows
            ids = [(7 * step + s) % 97 for s in live]
            pos = [len(seqs[s]) for s in live]
            for s, t in zip(live, ids):
                seqs[s].append(t)
            step_slots = [slot(s, p) for s, p in zip(live, pos)]
            written += step_slots
            meta = _meta(step_slots, [1] * len(live),
                         [len(seqs[s]) for s in live], [padded[s] for s in live], device)
            args = (torch.tensor(ids, device=device), torch.tensor(pos, device=device), meta)
            assert graphs is None or graphs.can_run(meta)
            hidden = graphs.run(*args) if graphs else model(*args, caches)
            out.append(hidden.clone())
    return out, written


def _check_graphs(graph_cls: type[DecodeGraphs], device: torch.device, dtype: torch.dtype) -> None:
    from shared.worker.attention.triton_backend import TritonAttention

    model = tiny_model(dtype).to(device)
    a = model.arch
    model.set_attention_backend(TritonAttention(a.num_attention_heads, a.num_key_value_heads,
                                                a.head_dim, a.head_dim ** -0.5))
    eager_caches = allocate_kv_caches(a, NUM_BLOCKS + 1, BLOCK_SIZE, dtype, device)
    before = [t.clone() for kv in eager_caches for t in kv]    # both runs start from this content
    expected, written = _decode_steps(model, eager_caches, None, device)
    caches = allocate_kv_caches(a, NUM_BLOCKS + 1, BLOCK_SIZE, dtype, device)
    graphs = graph_cls(model, caches, 4, MAX_LEN, BLOCK_SIZE, scratch_block=NUM_BLOCKS)
    graphs.capture()
    got, written_graphs = _decode_steps(model, caches, graphs, device)
    assert written_graphs == written
    tol = TOLERANCE[dtype]
    for step, (g, e) in enumerate(zip(got, expected)):
        torch.testing.assert_close(g, e, atol=tol, rtol=tol,
                                   msg=lambda m, step=step: f"decode step {step}: {m}")

    num_slots = (NUM_BLOCKS + 1) * BLOCK_SIZE
    real = torch.zeros(num_slots, dtype=torch.bool, device=device)
    real[torch.tensor(written, device=device)] = True
    scratch = torch.zeros(num_slots, dtype=torch.bool, device=device)
    scratch[NUM_BLOCKS * BLOCK_SIZE:] = True
    untouched = ~real & ~scratch                  # slots of the real blocks no token wrote
    assert real.sum() == len(set(written)) == len(written) and untouched.any()
    rows = lambda cache: [t.flatten(0, 1) for kv in cache for t in kv]   # noqa: E731 - [slot, KVH, D]
    for i, (g, e, b) in enumerate(zip(rows(caches), rows(eager_caches), [t.flatten(0, 1) for t in before])):
        what = f"{'kv'[i % 2]} cache of layer {i // 2}"
        # the real tokens' rows: written by both runs, equal within the dtype's tolerance
        assert (e[real] != b[real]).flatten(1).any(1).all(), f"eager run left a real slot alone ({what})"
        torch.testing.assert_close(g[real], e[real], atol=tol, rtol=tol,
                                   msg=lambda m, what=what: f"{what}: {m}")
        # nobody else wrote a real block: its other slots are exactly what they were
        assert torch.equal(g[untouched], b[untouched]), f"graph run wrote outside its slots ({what})"
        assert torch.equal(e[untouched], b[untouched]), f"eager run wrote outside its slots ({what})"
        # the padding rows went to the scratch block, which the eager run never touches
        assert torch.equal(e[scratch], b[scratch]), f"eager run wrote the scratch block ({what})"
        assert not torch.equal(g[scratch], b[scratch]), f"padding rows missed the scratch block ({what})"

def test_capture_sizes() -> None:
    assert capture_sizes(1) == [1]
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert capture_sizes(100) == [1, 2, 4, 8, 16, 32, 64, 100]


def test_padded_replay_matches_eager(device: torch.device) -> None:
    _check_graphs(EagerGraphs, device, torch.float32)


def test_graphs_refuse_prefill_and_oversized_batches() -> None:
    g = EagerGraphs.__new__(EagerGraphs)
    g.sizes, g.max_blocks = [1, 2], 8
    table = [[0]]
    assert not g.can_run(_meta([0, 1], [2], [2], table, torch.device("cpu")))
    assert not g.can_run(_meta([0, 1, 2], [1, 1, 1], [1, 1, 1], table * 3, torch.device("cpu")))
    assert g.can_run(_meta([0, 1], [1, 1], [1, 1], table * 2, torch.device("cpu")))


@pytest.mark.cuda               # skipped without a GPU by tests/skip_guard.py: "needs a CUDA GPU"
@pytest.mark.parametrize("dtype", [torch.float32])
def test_captured_graphs_match_eager_on_cuda(dtype: torch.dtype) -> None:
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("needs a CUDA GPU with native Triton: run with TRITON_INTERPRET=0")
    _check_graphs(DecodeGraphs, torch.device("cuda"), dtype)

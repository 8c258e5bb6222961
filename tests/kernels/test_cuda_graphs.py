"""Decode CUDA graphs: padding rows stay in the scratch block, replays match the eager model.

On CPU the graph is replaced by a re-run of the same forward over the static buffers (what a
replay executes), so the padding, static metadata and upper-bound plan are tested under the
interpreter; the ``cuda`` test captures real graphs.
"""
from __future__ import annotations

import os

import pytest
import torch

from shared.attention_metadata import AttentionMetadata
from shared.cuda_graphs import DecodeGraphs, capture_sizes
from shared.model_loader import allocate_kv_caches
from tests.kernels.helpers import tiny_model

pytest.importorskip("triton")

BLOCK_SIZE, NUM_BLOCKS, MAX_LEN = 4, 12, 32
PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18]]


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
                  steps: int = 3) -> list[torch.Tensor]:
    """Prefill PROMPTS eagerly, then decode ``steps`` tokens each (through ``graphs`` if given)."""
    tables = [[1, 7, 3], [9, 2, 0], [4, 10, 6, 5]]   # shuffled, with room for the decode tokens
    seqs = [list(p) for p in PROMPTS]
    slot = lambda s, p: tables[s][p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE  # noqa: E731
    ids = [t for p in seqs for t in p]
    pos = [i for p in seqs for i in range(len(p))]
    slots = [slot(s, i) for s, p in enumerate(seqs) for i in range(len(p))]
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
            meta = _meta([slot(s, p) for s, p in zip(live, pos)], [1] * len(live),
                         [len(seqs[s]) for s in live], [padded[s] for s in live], device)
            args = (torch.tensor(ids, device=device), torch.tensor(pos, device=device), meta)
            assert graphs is None or graphs.can_run(meta)
            hidden = graphs.run(*args) if graphs else model(*args, caches)
            out.append(hidden.clone())
    return out


def _check_graphs(graph_cls: type[DecodeGraphs], device: torch.device, dtype: torch.dtype) -> None:
    from shared.attention_triton import TritonAttention

    model = tiny_model(dtype).to(device)
    a = model.arch
    model.set_attention_backend(TritonAttention(a.num_attention_heads, a.num_key_value_heads,
                                                a.head_dim, a.head_dim ** -0.5))
    eager_caches = allocate_kv_caches(a, NUM_BLOCKS + 1, BLOCK_SIZE, dtype, device)
    expected = _decode_steps(model, eager_caches, None, device)
    caches = allocate_kv_caches(a, NUM_BLOCKS + 1, BLOCK_SIZE, dtype, device)
    graphs = graph_cls(model, caches, 4, MAX_LEN, BLOCK_SIZE, scratch_block=NUM_BLOCKS)
    graphs.capture()
    got = _decode_steps(model, caches, graphs, device)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)
    for (k, v), (k_ref, v_ref) in zip(caches, eager_caches):   # padding wrote only the scratch block
        assert torch.equal(k[:NUM_BLOCKS], k_ref[:NUM_BLOCKS])
        assert torch.equal(v[:NUM_BLOCKS], v_ref[:NUM_BLOCKS])


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


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32])
def test_captured_graphs_match_eager_on_cuda(dtype: torch.dtype) -> None:
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("CUDA graphs need native Triton (run with TRITON_INTERPRET=0)")
    _check_graphs(DecodeGraphs, torch.device("cuda"), dtype)

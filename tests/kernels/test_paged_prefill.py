"""Paged prefill attention against its reference, and the reference against TorchAttention."""
from __future__ import annotations

import pytest
import torch

from kernels.paged_prefill import paged_prefill_ref
from shared.worker.attention.metadata import AttentionMetadata
from shared.worker.attention.torch_backend import TorchAttention
from tests.kernels.helpers import assert_close, make_batch

# (context after this step, query rows): a fresh prompt, a chunk after a cached prefix, a one-token
# sequence, a decode row, a chunk longer than one tile, and an empty chunk.
CASES = [(5, 5), (20, 7), (1, 1), (33, 1), (40, 18), (9, 0)]
SEQ_LENS = [s for s, _ in CASES]
QUERY_LENS = [q for _, q in CASES]


def _reference(batch) -> torch.Tensor:  # noqa: ANN001
    return paged_prefill_ref(batch.q, batch.k_cache, batch.v_cache, batch.block_tables,
                             batch.query_start_loc, batch.seq_lens, batch.scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_prefill_matches_reference(dtype: torch.dtype, block_size: int, group: int,
                                   device: torch.device) -> None:
    pytest.importorskip("triton")
    from kernels.paged_prefill import paged_prefill

    batch = make_batch(SEQ_LENS, QUERY_LENS, group, 1, 16, block_size, dtype, device)
    out = paged_prefill(batch.q, batch.k_cache, batch.v_cache, batch.block_tables,
                        batch.query_start_loc, batch.seq_lens, batch.scale, batch.max_query_len)
    assert_close(out, _reference(batch), dtype)


def test_prefill_empty_batch(device: torch.device) -> None:
    pytest.importorskip("triton")
    from kernels.paged_prefill import paged_prefill

    batch = make_batch([4], [0], 2, 1, 16, 8, torch.float32, device)
    out = paged_prefill(batch.q, batch.k_cache, batch.v_cache, batch.block_tables,
                        batch.query_start_loc, batch.seq_lens, batch.scale, 0)
    assert out.shape == (0, 2, 16)


def test_prefill_rejects_mismatched_metadata(device: torch.device) -> None:
    pytest.importorskip("triton")
    from kernels.paged_prefill import paged_prefill

    batch = make_batch([4, 6], [4, 2], 2, 1, 16, 8, torch.float32, device)
    with pytest.raises(ValueError, match="query_start_loc"):
        paged_prefill(batch.q, batch.k_cache, batch.v_cache, batch.block_tables,
                      batch.query_start_loc[:-1], batch.seq_lens, batch.scale, 4)
    with pytest.raises(ValueError, match="dtype"):
        paged_prefill(batch.q.half(), batch.k_cache, batch.v_cache, batch.block_tables,
                      batch.query_start_loc, batch.seq_lens, batch.scale, 4)


def test_reference_matches_torch_backend() -> None:
    """The kernel's reference agrees with the tested CPU backend on chunks over cached prefixes."""
    cases = [c for c in CASES if c[1] > 1]
    seq_lens, q_lens = [s for s, _ in cases], [q for _, q in cases]
    batch = make_batch(seq_lens, q_lens, 6, 2, 16, 8, torch.float32, torch.device("cpu"))
    backend = TorchAttention(6, 2, 16, batch.scale)
    meta = AttentionMetadata(torch.zeros(0, dtype=torch.int64), batch.query_start_loc, batch.seq_lens,
                             batch.block_tables, 8, q_lens, seq_lens)
    plan = backend.plan(meta)
    q = batch.q
    for p in plan.prefills:
        if p.block_ids is None:                      # a fresh prompt reads this step's K/V: skip
            continue
        got = backend._prefill(q, q, q, batch.k_cache, batch.v_cache, p)
        torch.testing.assert_close(got, _reference(batch)[p.start:p.end], atol=1e-5, rtol=1e-5)

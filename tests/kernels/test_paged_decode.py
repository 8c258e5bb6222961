"""Paged decode attention against its reference, and the reference against TorchAttention."""
from __future__ import annotations

import pytest
import torch

from kernels.paged_decode import decode_split_len, paged_decode_ref
from shared.worker.attention.metadata import AttentionMetadata
from shared.worker.attention.torch_backend import TorchAttention
from tests.kernels.helpers import assert_close, make_batch

# Ragged contexts: one token, within a block, several blocks, past several splits of 16.
SEQ_LENS = [1, 7, 33, 17]


def _run(batch, split_len: int | None) -> torch.Tensor:  # noqa: ANN001
    from kernels.paged_decode import paged_decode

    return paged_decode(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
                        batch.scale, max(SEQ_LENS), split_len=split_len)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_decode_matches_reference(dtype: torch.dtype, block_size: int, group: int,
                                  device: torch.device) -> None:
    pytest.importorskip("triton")
    batch = make_batch(SEQ_LENS, [1] * len(SEQ_LENS), 2 * group, 2, 16, block_size, dtype, device)
    ref = paged_decode_ref(batch.q, batch.k_cache, batch.v_cache, batch.block_tables,
                           batch.seq_lens, batch.scale)
    assert_close(_run(batch, split_len=16), ref, dtype)      # 3 splits, some empty


@pytest.mark.parametrize("head_dim", [16, 24])
def test_decode_default_split_and_odd_head_dim(head_dim: int, device: torch.device) -> None:
    pytest.importorskip("triton")
    batch = make_batch(SEQ_LENS, [1] * 4, 4, 1, head_dim, 8, torch.float32, device, seed=1)
    ref = paged_decode_ref(batch.q, batch.k_cache, batch.v_cache, batch.block_tables,
                           batch.seq_lens, batch.scale)
    assert_close(_run(batch, split_len=None), ref, torch.float32)


def test_decode_empty_batch(device: torch.device) -> None:
    pytest.importorskip("triton")
    from kernels.paged_decode import paged_decode

    batch = make_batch([3], [1], 2, 1, 16, 8, torch.float32, device)
    out = paged_decode(batch.q[:0], batch.k_cache, batch.v_cache, batch.block_tables[:0],
                       batch.seq_lens[:0], batch.scale, 1)
    assert out.shape == (0, 2, 16)


def test_split_len_bounds_the_number_of_splits() -> None:
    assert decode_split_len(1, 64) == 512
    assert decode_split_len(100_000, 64) * 32 >= 100_000
    assert decode_split_len(100_000, 64) % 64 == 0


@pytest.mark.parametrize("group", [1, 3])
def test_reference_matches_torch_backend(group: int) -> None:
    """The kernel's reference agrees with the tested CPU backend (no Triton needed)."""
    batch = make_batch(SEQ_LENS, [1] * 4, 2 * group, 2, 16, 8, torch.float32, torch.device("cpu"))
    backend = TorchAttention(2 * group, 2, 16, batch.scale)
    meta = AttentionMetadata(torch.zeros(0, dtype=torch.int64), batch.query_start_loc, batch.seq_lens,
                             batch.block_tables, 8, [1] * 4, SEQ_LENS)
    (decode,) = backend.plan(meta).decodes     # four rows: too few to split by length
    torch_out = backend._decode(batch.q, batch.k_cache, batch.v_cache, decode)
    ref = paged_decode_ref(batch.q, batch.k_cache, batch.v_cache, batch.block_tables,
                           batch.seq_lens, batch.scale)
    torch.testing.assert_close(torch_out, ref, atol=1e-5, rtol=1e-5)

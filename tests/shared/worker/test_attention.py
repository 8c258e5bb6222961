"""TorchAttention's decode path on ragged batches, against a naive per-sequence reference."""
from __future__ import annotations

import pytest
import torch

from shared.worker.attention.metadata import AttentionMetadata
from shared.worker.attention.torch_backend import TorchAttention, _length_groups

H, KVH, D, BS = 6, 2, 16, 4


def _naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [H, D], k/v [L, KVH, D] -> [H, D], GQA by repeating K/V heads."""
    k, v = k.repeat_interleave(H // KVH, dim=1), v.repeat_interleave(H // KVH, dim=1)
    scores = torch.einsum("hd,lhd->hl", q, k) / D ** 0.5
    return torch.einsum("hl,lhd->hd", scores.softmax(-1), v)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_ragged_decode_batch_is_split_and_exact(cache_dtype: torch.dtype) -> None:
    # A bf16 cache under float32 queries (--kv-cache-dtype bfloat16) is widened where it is read.
    torch.manual_seed(0)
    lens = [5, 7, 9, 11, 12, 13, 14, 15, 16, 17, 150, 160, 170, 180, 190, 199, 200, 120, 130, 140]
    num_blocks = sum(-(-n // BS) for n in lens) + 4
    k_cache = torch.randn(num_blocks, BS, KVH, D).to(cache_dtype)
    v_cache = torch.randn(num_blocks, BS, KVH, D).to(cache_dtype)
    perm = torch.randperm(num_blocks).tolist()
    tables, slots, used = [], [], 0
    for n in lens:
        blocks = perm[used:used + -(-n // BS)]
        used += len(blocks)
        tables.append(blocks)
        slots.append(blocks[(n - 1) // BS] * BS + (n - 1) % BS)
    width = max(len(t) for t in tables)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots), query_start_loc=torch.arange(len(lens) + 1, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        block_size=BS, query_lens_list=[1] * len(lens), seq_lens_list=lens)
    attn = TorchAttention(H, KVH, D, D ** -0.5)
    plan = attn.plan(meta)
    assert len(plan.decodes) > 1                       # the ragged batch was split by length
    q, k, v = torch.randn(len(lens), H, D), torch.randn(len(lens), KVH, D), torch.randn(len(lens), KVH, D)
    out = attn.forward(q, k, v, (k_cache, v_cache), plan).view(len(lens), H, D)
    for i, n in enumerate(lens):
        ks = k_cache[tables[i]].flatten(0, 1)[:n].float()
        vs = v_cache[tables[i]].flatten(0, 1)[:n].float()
        torch.testing.assert_close(out[i], _naive(q[i], ks, vs), atol=1e-5, rtol=1e-5)


def test_length_groups_keep_every_row_once_and_leave_even_batches_whole() -> None:
    even = list(range(16))
    assert _length_groups(even, [100] * 16) == [even]
    ragged = [10] * 10 + [500] * 10
    groups = _length_groups(list(range(20)), ragged)
    assert sorted(i for g in groups for i in g) == list(range(20))
    assert groups == [list(range(10)), list(range(10, 20))]


def test_backends_share_one_interface() -> None:
    from shared.worker.attention.base import AttentionBackend
    from shared.worker.attention.triton_backend import TritonAttention

    for cls in (TorchAttention, TritonAttention):
        backend = cls(9, 3, 64, 64 ** -0.5)
        assert isinstance(backend, AttentionBackend), cls
        assert (backend.num_heads, backend.num_kv_heads, backend.head_dim) == (9, 3, 64)

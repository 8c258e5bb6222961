"""Paged decode attention: one query token per sequence against its cached context.

Flash-decoding: the context of each sequence is cut into splits of ``split_len`` keys; one program
per (sequence, KV head, split) computes a partial softmax for all query heads of that KV head
(GQA: the group's heads are the rows of one small matmul), then a reduce merges the splits::

    keys  |--- split 0 ---|--- split 1 ---|-- split 2 --|      (empty splits write lse = -inf)
            (o0, lse0)      (o1, lse1)      (o2, lse2)   -> out = sum_i w_i o_i,  w = softmax(lse)

Keys are read through the block table one key at a time (``table[pos // block_size]``), so any
block size works. The number of splits depends only on ``max_seq_len`` (an upper bound is fine),
which keeps the launch shape fixed under CUDA-graph capture.
"""
from __future__ import annotations

import torch

from kernels._triton import (
    cdiv, check_cache_pair, check_ready, check_tensor, dot_options, interpreting, jit, mma, next_pow2,
    tl)

MAX_SPLITS = 32
MIN_SPLIT_LEN = 512


def paged_decode_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, H, D]; block_tables [B, W] int32; seq_lens [B] int32 -> [B, H, D] in q's dtype."""
    b, h, d = q.shape
    kvh, bs = k_cache.shape[2], k_cache.shape[1]
    out = torch.empty_like(q)
    for i in range(b):
        n = int(seq_lens[i])
        blocks = block_tables[i, :cdiv(n, bs)].long()
        k = k_cache[blocks].reshape(-1, kvh, d)[:n].float().repeat_interleave(h // kvh, dim=1)
        v = v_cache[blocks].reshape(-1, kvh, d)[:n].float().repeat_interleave(h // kvh, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[i].float(), k) * scale
        out[i] = torch.einsum("hn,nhd->hd", scores.softmax(-1), v).to(q.dtype)
    return out


def decode_block_n() -> int:
    """Keys per loop iteration: small tiles keep the interpreter fast."""
    return 16 if interpreting() else 64


def decode_split_len(max_seq_len: int, block_n: int) -> int:
    """Keys per split: at least MIN_SPLIT_LEN, and few enough splits to stay under MAX_SPLITS."""
    want = max(MIN_SPLIT_LEN, cdiv(max(max_seq_len, 1), MAX_SPLITS))
    return cdiv(want, block_n) * block_n


@jit
def _decode_split_kernel(q_ptr, kc_ptr, vc_ptr, table_ptr, seq_lens_ptr, part_o_ptr, part_lse_ptr,
                         scale, stride_qb, stride_qh, stride_cb, stride_cs, stride_ch, stride_tb,
                         block_size, split_len, num_heads,
                         GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr,
                         DOT_UPCAST: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    seq_len = tl.load(seq_lens_ptr + b)
    start = split * split_len
    end = tl.minimum(seq_len, start + split_len)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + g
    qmask = (g < GROUP)[:, None] & (d < HEAD_DIM)[None, :]
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=qmask, other=0.0)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        valid = pos < end
        block = tl.load(table_ptr + b * stride_tb + pos // block_size, mask=valid, other=0).to(tl.int64)
        row = block * stride_cb + (pos % block_size) * stride_cs + kvh * stride_ch
        kvmask = valid[:, None] & (d < HEAD_DIM)[None, :]
        k = tl.load(kc_ptr + row[:, None] + d[None, :], mask=kvmask, other=0.0)
        s = mma(q, tl.trans(k), DOT_PREC, DOT_UPCAST) * scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)                    # 0 on the first tile (m = -inf)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        v = tl.load(vc_ptr + row[:, None] + d[None, :], mask=kvmask, other=0.0)
        acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, DOT_PREC, DOT_UPCAST)
        m = m_new
    nonempty = l > 0
    out = acc / tl.where(nonempty, l, 1.0)[:, None]
    lse = tl.where(nonempty, m + tl.log(tl.where(nonempty, l, 1.0)), float("-inf"))
    part = (b * num_heads + heads) * num_splits + split      # partials are [B, H, splits, (D)]
    tl.store(part_o_ptr + part[:, None] * HEAD_DIM + d[None, :], out, mask=qmask)
    tl.store(part_lse_ptr + part, lse, mask=g < GROUP)


@jit
def _decode_reduce_kernel(part_o_ptr, part_lse_ptr, out_ptr, stride_ob, stride_oh, num_heads,
                          num_splits, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                          BLOCK_S: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    base = (b * num_heads + h) * num_splits
    lse = tl.load(part_lse_ptr + base + s, mask=s < num_splits, other=float("-inf"))
    w = tl.exp(lse - tl.max(lse, 0))                 # split 0 always holds a key: max is finite
    mask = (s < num_splits)[:, None] & (d < HEAD_DIM)[None, :]
    o = tl.load(part_o_ptr + (base + s)[:, None] * HEAD_DIM + d[None, :], mask=mask, other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.sum(w, 0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, out.to(out_ptr.dtype.element_ty),
             mask=d < HEAD_DIM)


def decode_workspace(num_seqs: int, num_heads: int, head_dim: int, num_splits: int,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial outputs [B, H, splits, D] and log-sum-exps [B, H, splits], float32; reusable
    across the layers of one step."""
    return (torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=device),
            torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=device))


def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
           seq_lens: torch.Tensor) -> None:
    check_tensor("q", q, 3)
    check_cache_pair(k_cache, v_cache)
    check_tensor("block_tables", block_tables, 2, (torch.int32,))
    check_tensor("seq_lens", seq_lens, 1, (torch.int32,))
    b, h, d = q.shape
    if q.dtype != k_cache.dtype:
        raise ValueError(f"q dtype {q.dtype} != cache dtype {k_cache.dtype}")
    if d != k_cache.shape[3] or h % k_cache.shape[2]:
        raise ValueError(f"q [{b}, {h}, {d}] does not fit cache heads/dim {tuple(k_cache.shape[2:])}")
    if block_tables.shape[0] != b or seq_lens.shape[0] != b:
        raise ValueError(f"{b} queries but block_tables {tuple(block_tables.shape)}, "
                         f"seq_lens {tuple(seq_lens.shape)}")
    check_ready(q, k_cache, v_cache, block_tables, seq_lens)


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                 max_seq_len: int, split_len: int | None = None,
                 workspace: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The Triton version of ``paged_decode_ref``. ``max_seq_len`` bounds every seq_len (it sets
    the number of splits); every seq_len must be >= 1."""
    _check(q, k_cache, v_cache, block_tables, seq_lens)
    b, h, d = q.shape
    out = torch.empty_like(q)
    if b == 0:
        return out
    kvh = k_cache.shape[2]
    block_n = decode_block_n()
    split_len = split_len or decode_split_len(max_seq_len, block_n)
    num_splits = cdiv(max(max_seq_len, 1), split_len)
    part_o, part_lse = workspace or decode_workspace(b, h, d, num_splits, q.device)
    if part_lse.shape != (b, h, num_splits):
        raise ValueError(f"workspace lse {tuple(part_lse.shape)} != {(b, h, num_splits)}")
    group, block_d = h // kvh, max(16, next_pow2(d))
    _decode_split_kernel[(b, kvh, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, part_o, part_lse, scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), k_cache.shape[1], split_len, h,
        GROUP=group, GROUP_PAD=max(16, next_pow2(group)), HEAD_DIM=d, BLOCK_D=block_d,
        BLOCK_N=block_n, **dot_options(q.dtype))
    _decode_reduce_kernel[(b, h)](
        part_o, part_lse, out, out.stride(0), out.stride(1), h, num_splits,
        HEAD_DIM=d, BLOCK_D=block_d, BLOCK_S=max(2, next_pow2(num_splits)))
    return out

"""Paged prefill attention: causal attention for a batch of prompt chunks of different lengths.

A sequence's chunk of ``q_len`` query rows sits at positions ``[seq_len - q_len, seq_len)``; the
keys before it may already be in cached blocks (prefix caching, chunked prefill). This step's
K/V are written to the cache first (``store_kv``), so every key is read through the block table::

    keys     0 ........ cached-1 | cached ...... seq_len-1
    query row r (position cached + r) sees keys 0 .. cached + r

One program per (sequence, query head, tile of BLOCK_M query rows), online softmax over key tiles.
Rows of one sequence may also be a single decode token, so a mixed batch needs only this kernel.
"""
from __future__ import annotations

import torch

from kernels._triton import (
    cdiv, check_cache_pair, check_ready, check_tensor, dot_options, interpreting, jit, mma, next_pow2,
    tl)


def paged_prefill_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                      seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """q [N, H, D]; query_start_loc [S+1] int32; seq_lens [S] int32 -> [N, H, D] in q's dtype."""
    h, d = q.shape[1:]
    kvh, bs = k_cache.shape[2], k_cache.shape[1]
    out = torch.empty_like(q)
    for i in range(seq_lens.shape[0]):
        start, end, n = int(query_start_loc[i]), int(query_start_loc[i + 1]), int(seq_lens[i])
        if end == start:
            continue
        blocks = block_tables[i, :cdiv(n, bs)].long()
        k = k_cache[blocks].reshape(-1, kvh, d)[:n].float().repeat_interleave(h // kvh, dim=1)
        v = v_cache[blocks].reshape(-1, kvh, d)[:n].float().repeat_interleave(h // kvh, dim=1)
        q_pos = torch.arange(n - (end - start), n, device=q.device)
        visible = torch.arange(n, device=q.device)[None, :] <= q_pos[:, None]       # [q, n]
        scores = torch.einsum("qhd,nhd->hqn", q[start:end].float(), k) * scale
        probs = scores.masked_fill(~visible[None], float("-inf")).softmax(-1)
        out[start:end] = torch.einsum("hqn,nhd->qhd", probs, v).to(q.dtype)
    return out


@jit
def _prefill_kernel(q_ptr, kc_ptr, vc_ptr, table_ptr, qsl_ptr, seq_lens_ptr, out_ptr, scale,
                    stride_qn, stride_qh, stride_on, stride_oh, stride_cb, stride_cs, stride_ch,
                    stride_tb, block_size,
                    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr,
                    DOT_UPCAST: tl.constexpr):
    s = tl.program_id(0)
    h = tl.program_id(1)
    m0 = tl.program_id(2) * BLOCK_M
    q_start = tl.load(qsl_ptr + s)
    q_len = tl.load(qsl_ptr + s + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + s)
    rows = m0 + tl.arange(0, BLOCK_M)
    q_pos = seq_len - q_len + rows                   # padding rows lie past seq_len: all keys
    d = tl.arange(0, BLOCK_D)                        # visible, so their softmax stays finite
    qmask = (rows < q_len)[:, None] & (d < HEAD_DIM)[None, :]
    q = tl.load(q_ptr + (q_start + rows)[:, None] * stride_qn + h * stride_qh + d[None, :],
                mask=qmask, other=0.0)
    kvh = h // GROUP
    # Keys past this tile's last row are never visible; tiles with no rows do no work.
    hi = tl.where(m0 < q_len, tl.minimum(seq_len, seq_len - q_len + m0 + BLOCK_M), 0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(0, hi, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        valid = pos < seq_len
        block = tl.load(table_ptr + s * stride_tb + pos // block_size, mask=valid, other=0).to(tl.int64)
        row = block * stride_cb + (pos % block_size) * stride_cs + kvh * stride_ch
        kvmask = valid[:, None] & (d < HEAD_DIM)[None, :]
        k = tl.load(kc_ptr + row[:, None] + d[None, :], mask=kvmask, other=0.0)
        sc = mma(q, tl.trans(k), DOT_PREC, DOT_UPCAST) * scale
        sc = tl.where(valid[None, :] & (pos[None, :] <= q_pos[:, None]), sc, float("-inf"))
        m_new = tl.maximum(m, tl.max(sc, 1))         # key 0 is in the first tile: finite from it on
        alpha = tl.exp(m - m_new)
        p = tl.exp(sc - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        v = tl.load(vc_ptr + row[:, None] + d[None, :], mask=kvmask, other=0.0)
        acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, DOT_PREC, DOT_UPCAST)
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(out_ptr + (q_start + rows)[:, None] * stride_on + h * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=qmask)


def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
           query_start_loc: torch.Tensor, seq_lens: torch.Tensor) -> None:
    check_tensor("q", q, 3)
    check_cache_pair(k_cache, v_cache)
    check_tensor("block_tables", block_tables, 2, (torch.int32,))
    check_tensor("query_start_loc", query_start_loc, 1, (torch.int32,))
    check_tensor("seq_lens", seq_lens, 1, (torch.int32,))
    n, h, d = q.shape
    if q.dtype != k_cache.dtype:
        raise ValueError(f"q dtype {q.dtype} != cache dtype {k_cache.dtype}")
    if d != k_cache.shape[3] or h % k_cache.shape[2]:
        raise ValueError(f"q [{n}, {h}, {d}] does not fit cache heads/dim {tuple(k_cache.shape[2:])}")
    num_seqs = seq_lens.shape[0]
    if query_start_loc.shape[0] != num_seqs + 1 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"{num_seqs} seq_lens but query_start_loc {tuple(query_start_loc.shape)}, "
                         f"block_tables {tuple(block_tables.shape)}")
    check_ready(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens)


def paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  block_tables: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                  scale: float, max_query_len: int) -> torch.Tensor:
    """The Triton version of ``paged_prefill_ref``; ``max_query_len`` bounds every chunk's length
    (passed in so the launch needs no device-to-host sync)."""
    _check(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens)
    n, h, d = q.shape
    out = torch.empty_like(q)
    num_seqs = seq_lens.shape[0]
    if n == 0 or num_seqs == 0 or max_query_len < 1:
        return out
    block_m = block_n = 16 if interpreting() else 64
    if not interpreting() and max_query_len <= 16:
        block_m = 16                                 # decode rows and short chunks: less padding
    grid = (num_seqs, h, cdiv(max_query_len, block_m))
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, out, scale,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        k_cache.shape[1], GROUP=h // k_cache.shape[2], HEAD_DIM=d, BLOCK_D=max(16, next_pow2(d)),
        BLOCK_M=block_m, BLOCK_N=block_n, **dot_options(q.dtype))
    return out

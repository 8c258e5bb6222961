"""Paged attention on CPU through the native kernel (``shared/worker/native/attention.c``).

Decode rows, short chunks (up to ``NATIVE_MAX_QUERY`` tokens) and every sequence whose context
is at most ``NATIVE_MAX_CONTEXT`` tokens read K/V in place through the block tables: no gathered
copy per layer, no padding to the longest row, no masks, GQA without repeating K/V. Long
chunks over a long context keep SDPA: there the work (q_len x context) is compute-bound and
its blocked matmuls beat the kernel's per-row dot products, while for short contexts SDPA's
per-call cost and the gather dominate (README: per-layer times of both on fresh prompts and
chunks). Every query token is one row for the kernel: its block-table row and the number of
keys it sees (its position + 1), so ragged batches need no grouping.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from shared.worker.attention.metadata import AttentionMetadata
from shared.worker.attention.torch_backend import PrefillPlan, TorchAttention
from shared.worker.native.abi import MAX_DIM, MAX_GROUP, PagedKV

if TYPE_CHECKING:
    from shared.worker.native.build import NativeKernels

NATIVE_MAX_QUERY = 16               # longer query chunks take SDPA (see above)
NATIVE_MAX_CONTEXT = 512            # longer contexts with longer chunks take SDPA (see above)


def takes_kernel(q_len: int, seq_len: int) -> bool:
    """Whether a sequence's query tokens this step go through attention.c (else SDPA)."""
    return q_len <= NATIVE_MAX_QUERY or seq_len <= NATIVE_MAX_CONTEXT


@dataclass
class NativePlan:
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor         # [S, W] int32, contiguous
    token_index: torch.Tensor | None   # [T] rows of the flat batch the kernel serves; None: all
    table_row: torch.Tensor            # [T] int32, each such token's row of block_tables
    ctx: torch.Tensor                  # [T] int32, keys each such token sees
    sdpa: list[PrefillPlan]            # long chunks over long contexts (fresh prompts too)


def supports(num_heads: int, num_kv_heads: int, head_dim: int, cache_dtype: torch.dtype) -> bool:
    group = num_heads // num_kv_heads
    return (num_heads % num_kv_heads == 0 and group <= MAX_GROUP and head_dim <= MAX_DIM
            and cache_dtype in (torch.float32, torch.bfloat16))


class NativeAttention(TorchAttention):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 native: NativeKernels, num_threads: int) -> None:
        super().__init__(num_heads, num_kv_heads, head_dim, scale)
        self.native, self.num_threads = native, num_threads
        self.capacity = 8 * num_threads     # partial results of attention.c's position split
        self.scratch = torch.empty(self.capacity * (self.group * head_dim + 2 * MAX_GROUP))

    def plan(self, meta: AttentionMetadata) -> NativePlan:  # type: ignore[override]
        token_index, table_row, ctx, sdpa = [], [], [], []
        start = 0
        for i, (q_len, seq_len) in enumerate(zip(meta.query_lens_list, meta.seq_lens_list)):
            if not takes_kernel(q_len, seq_len):
                sdpa.append(self._prefill_plan(meta, i, start, start + q_len))
            else:
                token_index.extend(range(start, start + q_len))
                table_row.extend([i] * q_len)
                ctx.extend(range(seq_len - q_len + 1, seq_len + 1))
            start += q_len
        index = None if not sdpa else torch.tensor(token_index, dtype=torch.int64)
        return NativePlan(meta.slot_mapping, meta.block_tables.contiguous(), index,
                          torch.tensor(table_row, dtype=torch.int32),
                          torch.tensor(ctx, dtype=torch.int32), sdpa)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,  # type: ignore[override]
                kv_cache: tuple[torch.Tensor, torch.Tensor], plan: NativePlan) -> torch.Tensor:
        k_cache, v_cache = kv_cache
        self.write_cache(k, v, k_cache, v_cache, plan.slot_mapping)
        n = q.shape[0]
        if plan.token_index is None:
            return self._attend(q, k_cache, v_cache, plan).to(q.dtype).reshape(n, -1)
        out = torch.empty_like(q)
        for p in plan.sdpa:
            out[p.start:p.end] = self._prefill(q, k, v, k_cache, v_cache, p)
        if plan.token_index.numel():
            rows = self._attend(q.index_select(0, plan.token_index), k_cache, v_cache, plan)
            out.index_copy_(0, plan.token_index, rows.to(q.dtype))
        return out.reshape(n, -1)

    def _attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                plan: NativePlan) -> torch.Tensor:
        q = q.float().contiguous()
        out = torch.empty_like(q)
        tables = plan.block_tables
        kv = PagedKV(k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), tables.shape[1],
                     k_cache.shape[1], self.num_heads, self.num_kv_heads, self.head_dim,
                     int(k_cache.dtype == torch.bfloat16), self.scale)
        rc = self.native.paged_attention(ctypes.addressof(kv), q.data_ptr(), q.shape[0],
                                         plan.table_row.data_ptr(), plan.ctx.data_ptr(),
                                         out.data_ptr(), self.scratch.data_ptr(), self.capacity,
                                         self.num_threads)
        if rc != 0:
            raise RuntimeError("paged_attention refused the shape")
        return out

"""Paged attention through the Triton kernels in ``kernels/``: the CUDA path.

Same interface as ``TorchAttention`` (``plan`` once per step, ``forward`` per layer). A step is
one of two shapes:

    decode only   every sequence has one query token -> split-K decode kernel + reduce
    anything else (prompts, chunks, mixed)           -> the varlen prefill kernel for all rows

``plan`` reads the host-side length lists only to size launches (max query length, number of
decode splits) and to allocate the decode workspace, so a plan built from upper bounds stays
valid for any lengths below them: what CUDA-graph capture needs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels._triton import cdiv
from kernels.paged_decode import decode_block_n, decode_split_len, decode_workspace, paged_decode
from kernels.paged_prefill import paged_prefill
from kernels.store_kv import store_kv
from shared.worker.attention.metadata import AttentionMetadata


@dataclass
class TritonPlan:
    meta: AttentionMetadata
    decode_only: bool
    max_query_len: int
    max_seq_len: int
    split_len: int
    workspace: tuple[torch.Tensor, torch.Tensor] | None   # decode partials, shared by all layers


class TritonAttention:
    """Stateless backend shared by all layers; each layer passes its own cache pair."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> None:
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale

    def plan(self, meta: AttentionMetadata) -> TritonPlan:
        max_q = max(meta.query_lens_list, default=0)
        max_seq = max(meta.seq_lens_list, default=0)
        decode_only = max_q == 1 and min(meta.query_lens_list) == 1
        split_len = decode_split_len(max_seq, decode_block_n())
        workspace = None
        if decode_only:
            workspace = decode_workspace(meta.num_seqs, self.num_heads, self.head_dim,
                                         cdiv(max_seq, split_len), meta.seq_lens.device)
        return TritonPlan(meta, decode_only, max_q, max_seq, split_len, workspace)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], plan: TritonPlan) -> torch.Tensor:
        """q [N, H, D], k/v [N, KVH, D] (RoPE applied) -> attention output [N, H * D]."""
        k_cache, v_cache = kv_cache
        meta = plan.meta
        self.write_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        if plan.decode_only:
            out = paged_decode(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, self.scale,
                               plan.max_seq_len, plan.split_len, plan.workspace)
        else:
            out = paged_prefill(q, k_cache, v_cache, meta.block_tables, meta.query_start_loc,
                                meta.seq_lens, self.scale, plan.max_query_len)
        return out.reshape(q.shape[0], -1)

    @staticmethod
    def write_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        store_kv(k, v, k_cache, v_cache, slot_mapping)

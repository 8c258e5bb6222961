"""Paged attention in plain torch: the CPU path, and the reference the Triton kernels are tested against.

The cache of one layer is a pair of tensors [num_blocks, block_size, kv_heads, head_dim]. A step's
batch mixes two kinds of sequence:

    decode rows   (query of 1 token)  -> gathered through their block tables, one batched SDPA call
    prefill rows  (query of q tokens) -> one SDPA call each; the query covers positions
                                         [seq_len - q, seq_len), so the causal mask is shifted by
                                         the cached context (a fresh prompt uses is_causal directly)

Everything that depends only on the metadata (which rows decode, block ids, masks) is built once per
step in ``plan()`` and reused by every layer. ``native_backend.NativeAttention`` replaces the gathers
with a kernel that reads the cache in place; this backend is its fallback and its reference.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from shared.worker.attention.metadata import AttentionMetadata


@dataclass
class DecodePlan:
    token_index: torch.Tensor | None   # [B] rows of the flat batch; None: the whole batch, in order
    block_ids: torch.Tensor            # [B * max_blocks] int64, flattened block tables
    mask: torch.Tensor                 # [B, 1, 1, max_blocks * block_size] bool, True = attend
    num_seqs: int


@dataclass
class PrefillPlan:
    start: int                         # first row of this sequence in the flat batch
    end: int
    seq_len: int                       # context after this step (cached + new)
    block_ids: torch.Tensor | None     # [blocks covering seq_len]; None for a fresh prompt
    mask: torch.Tensor | None          # [q, seq_len] bool; None for a fresh prompt (plain causal)


@dataclass
class AttentionPlan:
    slot_mapping: torch.Tensor
    decodes: list[DecodePlan]          # decode rows, in groups of similar context length
    prefills: list[PrefillPlan]


# Decode rows are padded to the longest context of their group; splitting a ragged batch into
# groups of similar length saves that padding (gather and SDPA work), each group costing one
# more SDPA call per layer.
_MAX_DECODE_GROUPS = 3
_MIN_GROUP_ROWS = 8


def _length_groups(rows: list[int], seq_lens: list[int]) -> list[list[int]]:
    """Split decode rows (sorted by context length) where that cuts padded work by a quarter."""
    if not rows:
        return []
    ordered = sorted(rows, key=lambda i: seq_lens[i])
    groups = [ordered]
    while len(groups) < _MAX_DECODE_GROUPS:
        last = groups[-1]
        cut = _best_cut(last, seq_lens)
        if cut is None:
            break
        groups[-1:] = [last[:cut], last[cut:]]
    return groups


def _best_cut(rows: list[int], seq_lens: list[int]) -> int | None:
    n = len(rows)
    whole = n * seq_lens[rows[-1]]
    best, best_cost = None, 0.75 * whole
    for cut in range(_MIN_GROUP_ROWS, n - _MIN_GROUP_ROWS + 1):
        cost = cut * seq_lens[rows[cut - 1]] + (n - cut) * seq_lens[rows[-1]]
        if cost < best_cost:
            best, best_cost = cut, cost
    return best


class TorchAttention:
    """Stateless backend shared by all layers; each layer passes its own cache pair."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> None:
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.group = num_heads // num_kv_heads

    def plan(self, meta: AttentionMetadata) -> AttentionPlan:
        starts = [0]
        for q_len in meta.query_lens_list:
            starts.append(starts[-1] + q_len)
        decode_rows = [i for i, q in enumerate(meta.query_lens_list) if q == 1]
        prefills = [self._prefill_plan(meta, i, starts[i], starts[i + 1])
                    for i, q in enumerate(meta.query_lens_list) if q > 1]
        groups = _length_groups(decode_rows, meta.seq_lens_list)
        all_decode = len(groups) == 1 and len(decode_rows) == len(meta.query_lens_list)
        decodes = [self._decode_plan(meta, rows, starts, all_decode) for rows in groups]
        return AttentionPlan(meta.slot_mapping, decodes, prefills)

    def _decode_plan(self, meta: AttentionMetadata, rows: list[int], starts: list[int],
                     all_decode: bool) -> DecodePlan:
        device = meta.block_tables.device
        bs = meta.block_size
        max_len = max(meta.seq_lens_list[i] for i in rows)
        num_blocks = -(-max_len // bs)
        row_index = None if all_decode else torch.tensor(rows, device=device)
        tables = meta.block_tables if all_decode else meta.block_tables.index_select(0, row_index)
        seq_lens = meta.seq_lens if all_decode else meta.seq_lens.index_select(0, row_index)
        key_pos = torch.arange(num_blocks * bs, device=device)
        mask = (key_pos[None, :] < seq_lens[:, None].long())[:, None, None, :]
        token_index = None if all_decode else torch.tensor([starts[i] for i in rows], device=device)
        return DecodePlan(token_index, tables[:, :num_blocks].reshape(-1).long(), mask, len(rows))

    def _prefill_plan(self, meta: AttentionMetadata, i: int, start: int, end: int) -> PrefillPlan:
        seq_len, q_len = meta.seq_lens_list[i], end - start
        cached = seq_len - q_len
        if cached == 0:
            return PrefillPlan(start, end, seq_len, None, None)
        device = meta.block_tables.device
        num_blocks = -(-seq_len // meta.block_size)
        block_ids = meta.block_tables[i, :num_blocks].long()
        # Query row r sits at position cached + r and sees keys 0..cached + r.
        q_pos = torch.arange(cached, seq_len, device=device)
        mask = torch.arange(seq_len, device=device)[None, :] <= q_pos[:, None]
        return PrefillPlan(start, end, seq_len, block_ids, mask)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], plan: AttentionPlan) -> torch.Tensor:
        """q [N, H, D], k/v [N, KVH, D] (RoPE applied) -> attention output [N, H * D]."""
        k_cache, v_cache = kv_cache
        self.write_cache(k, v, k_cache, v_cache, plan.slot_mapping)
        if len(plan.decodes) == 1 and plan.decodes[0].token_index is None:
            return self._decode(q, k_cache, v_cache, plan.decodes[0]).reshape(q.shape[0], -1)
        out = torch.empty_like(q)
        for p in plan.prefills:
            out[p.start:p.end] = self._prefill(q, k, v, k_cache, v_cache, p)
        for d in plan.decodes:
            out[d.token_index] = self._decode(q.index_select(0, d.token_index), k_cache, v_cache, d)
        return out.reshape(q.shape[0], -1)

    @staticmethod
    def write_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        # A flat [num_blocks * block_size, KVH, D] view makes a slot a single row index.
        k_cache.view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
        v_cache.view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v.to(v_cache.dtype))

    def _decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                plan: DecodePlan) -> torch.Tensor:
        b = plan.num_seqs
        # Gathering whole blocks (one index_select) is far cheaper than gathering single slots.
        # The gathered copy is widened to q's dtype (a bf16 cache under float32 activations).
        k = k_cache.index_select(0, plan.block_ids).view(b, -1, self.num_kv_heads, self.head_dim)
        v = v_cache.index_select(0, plan.block_ids).view(b, -1, self.num_kv_heads, self.head_dim)
        k, v = k.to(q.dtype), v.to(q.dtype)
        # GQA without repeating K/V: the query heads of one KV head act as that head's query rows.
        qg = q.view(b, self.num_kv_heads, self.group, self.head_dim)
        out = F.scaled_dot_product_attention(
            qg, k.transpose(1, 2), v.transpose(1, 2), attn_mask=plan.mask, scale=self.scale)
        return out.reshape(b, self.num_heads, self.head_dim)

    def _prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, p: PrefillPlan) -> torch.Tensor:
        qs = q[p.start:p.end].transpose(0, 1)[None]                 # [1, H, q, D]
        if p.block_ids is None:
            ks, vs = k[p.start:p.end], v[p.start:p.end]             # fresh prompt: this step's K/V
        else:
            ks = k_cache.index_select(0, p.block_ids).flatten(0, 1)[:p.seq_len].to(q.dtype)
            vs = v_cache.index_select(0, p.block_ids).flatten(0, 1)[:p.seq_len].to(q.dtype)
        out = F.scaled_dot_product_attention(
            qs, ks.transpose(0, 1)[None], vs.transpose(0, 1)[None], attn_mask=p.mask,
            is_causal=p.mask is None, scale=self.scale, enable_gqa=self.group > 1)
        return out[0].transpose(0, 1)                               # [q, H, D]

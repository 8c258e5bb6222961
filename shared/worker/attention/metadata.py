"""Per-step attention metadata, built by the model runner and passed down explicitly.

Sequences are laid out back to back in one flat batch of tokens::

    tokens:      | seq0 chunk (q0) | seq1 (1) | seq2 chunk (q2) |
    query_start:  0                 q0         q0+1              q0+1+q2
    seq_lens:     context of each sequence after this step (cached + new)

A token's K/V go to cache slot ``slot_mapping[i] = block_id * block_size + offset``, where
``block_id = block_table[pos // block_size]`` and ``offset = pos % block_size``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor      # [num_tokens] int64
    query_start_loc: torch.Tensor   # [num_seqs + 1] int32, cumulative query lengths
    seq_lens: torch.Tensor          # [num_seqs] int32, context length incl. this step's tokens
    block_tables: torch.Tensor      # [num_seqs, max_blocks] int32, padded with 0
    block_size: int
    # The same lengths as Python lists, so the CPU backend can branch without tensor syncs.
    query_lens_list: list[int]
    seq_lens_list: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_list)

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

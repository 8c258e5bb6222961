"""Decode CUDA graphs: capture the model's forward once per batch size, replay it for decode steps.

A decode step launches hundreds of small kernels; replaying a captured graph launches them with one
call. Graphs have fixed shapes and fixed input addresses, so the model reads its inputs from static
buffers and a batch of ``n`` sequences replays the smallest captured size ``b >= n``::

    rows      0 .. n-1                 n .. b-1
    inputs    this step's tokens       padding: token 0, position 0, one key in the scratch block
    slots     real cache slots         the scratch slot (a block the scheduler never hands out)

Padding rows write their K/V to the scratch slot and attend to that one key, so they never touch a
real sequence's cache and never produce NaNs. The attention plan is built at capture from upper
bounds (every context ``max_model_len`` long); the kernels read the real lengths from ``seq_lens``.
"""
from __future__ import annotations

import torch

from shared.worker.attention.metadata import AttentionMetadata
from shared.worker.models.llama import KVCache, LlamaForCausalLM


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, ... up to max_num_seqs, which is always the last size."""
    sizes = [1]
    while sizes[-1] * 2 < max_num_seqs:
        sizes.append(sizes[-1] * 2)
    return sizes + [max_num_seqs] if max_num_seqs > 1 else sizes


class DecodeGraphs:
    """Owns the static input buffers and one captured graph per batch size."""

    def __init__(self, model: LlamaForCausalLM, kv_caches: list[KVCache], max_num_seqs: int,
                 max_model_len: int, block_size: int, scratch_block: int) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = capture_sizes(max_num_seqs)
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.scratch_block = scratch_block
        self.max_blocks = -(-max_model_len // block_size)
        b, device = self.sizes[-1], kv_caches[0][0].device
        self.input_ids = torch.zeros(b, dtype=torch.int64, device=device)
        self.positions = torch.zeros(b, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((b,), scratch_block * block_size, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(b, dtype=torch.int32, device=device)
        self.block_tables = torch.full((b, self.max_blocks), scratch_block, dtype=torch.int32,
                                       device=device)
        self.query_start_loc = torch.arange(b + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def _metadata(self, b: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:b], query_start_loc=self.query_start_loc[:b + 1],
            seq_lens=self.seq_lens[:b], block_tables=self.block_tables[:b],
            block_size=self.block_size, query_lens_list=[1] * b,
            seq_lens_list=[self.max_model_len] * b)   # upper bounds: they only size the launches

    def _forward(self, b: int) -> torch.Tensor:
        return self.model(self.input_ids[:b], self.positions[:b], self._metadata(b), self.kv_caches)

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        for b in reversed(self.sizes):               # largest first: the others reuse its pool
            self._forward(b)                         # warm-up: Triton compiles, cuBLAS picks kernels
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[b] = self._forward(b)
            pool = graph.pool()
            self.graphs[b] = graph
        torch.cuda.synchronize()

    def can_run(self, meta: AttentionMetadata) -> bool:
        """Decode-only steps that fit the largest graph and the static block table."""
        return (0 < meta.num_seqs <= self.sizes[-1] and meta.num_tokens == meta.num_seqs
                and meta.block_tables.shape[1] <= self.max_blocks
                and max(meta.query_lens_list) == 1)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            meta: AttentionMetadata) -> torch.Tensor:
        """Copy the step into the static buffers, replay, return hidden states [n, hidden]."""
        n = meta.num_seqs
        b = next(s for s in self.sizes if s >= n)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.seq_lens[:n].copy_(meta.seq_lens)
        self.block_tables[:n, :meta.block_tables.shape[1]].copy_(meta.block_tables)
        if b > n:                                    # rows a bigger batch filled: back to padding
            self.input_ids[n:b].zero_()
            self.positions[n:b].zero_()
            self.slot_mapping[n:b].fill_(self.scratch_block * self.block_size)
            self.seq_lens[n:b].fill_(1)
            self.block_tables[n:b, 0].fill_(self.scratch_block)
        self.graphs[b].replay()
        return self.outputs[b][:n]

"""Which slice of each checkpoint tensor a tensor-parallel rank holds (Megatron's split).

Column-parallel (q/k/v, gate/up): rank r keeps its block of output rows, so it owns whole
attention heads, whole KV heads and a slice of the MLP's intermediate units, and needs no
communication. Row-parallel (o_proj, down_proj): the matching block of input columns; the
partial sums are all-reduced, so their bias lives on rank 0 only. Vocabulary-parallel
(embed_tokens, lm_head): a block of vocabulary rows, padded with zero rows to equal blocks.
"""
from __future__ import annotations

import dataclasses

import torch

from shared.worker.models.arch_config import ArchConfig
from shared.worker.models.layers import vocab_shard_rows

_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_ROW = ("o_proj", "down_proj")
_VOCAB = ("embed_tokens", "lm_head")


def check_divides(arch: ArchConfig, size: int) -> None:
    """Refuse a size that cannot split this model evenly, naming the sizes that can."""
    dims = {"attention heads": arch.num_attention_heads, "KV heads": arch.num_key_value_heads,
            "MLP intermediate size": arch.intermediate_size}
    bad = [f"{n} {what}" for what, n in dims.items() if n % size]
    if bad:
        fits = [k for k in range(1, arch.num_key_value_heads + 1)
                if all(n % k == 0 for n in dims.values())]
        raise ValueError(f"tensor_parallel_size {size} does not divide this model's "
                         f"{' and '.join(bad)}; sizes that fit: {fits}")


def shard_arch(arch: ArchConfig, size: int) -> ArchConfig:
    """The per-rank architecture: heads, KV heads and MLP width divided by ``size``. The
    vocabulary stays whole: the engine samples over all of it (the layers pad their shard)."""
    check_divides(arch, size)
    return dataclasses.replace(
        arch, num_attention_heads=arch.num_attention_heads // size,
        num_key_value_heads=arch.num_key_value_heads // size,
        intermediate_size=arch.intermediate_size // size)


def shard_tensor(hf_name: str, tensor: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Rank ``rank``'s part of the checkpoint tensor ``hf_name`` (norms stay whole)."""
    parts = hf_name.split(".")
    module, kind = (parts[-2], parts[-1]) if len(parts) >= 2 else ("", parts[-1])
    if module in _COLUMN:
        return tensor.chunk(size, dim=0)[rank]
    if module in _ROW:
        if kind == "bias":    # added once, after the all-reduce
            return tensor if rank == 0 else torch.zeros_like(tensor)
        return tensor.chunk(size, dim=1)[rank]
    if module in _VOCAB:
        rows = vocab_shard_rows(tensor.shape[0], size)
        block = tensor[rank * rows:(rank + 1) * rows]
        if block.shape[0] < rows:
            pad = block.new_zeros((rows - block.shape[0], *block.shape[1:]))
            block = torch.cat([block, pad])
        return block
    return tensor


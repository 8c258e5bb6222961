"""Random paged-attention batches (ragged lengths, shuffled blocks, tables padded with 0) and a
tiny random Llama."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from shared.worker.models import ArchConfig, LlamaForCausalLM

# Tolerances against the references, per dtype of the kernel's inputs.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol, rtol=tol)


@dataclass
class PagedBatch:
    q: torch.Tensor                 # [N, H, D] queries of this step's tokens
    k_cache: torch.Tensor           # [num_blocks, block_size, KVH, D], filled for every context key
    v_cache: torch.Tensor
    block_tables: torch.Tensor      # [S, W] int32
    query_start_loc: torch.Tensor   # [S + 1] int32
    seq_lens: torch.Tensor          # [S] int32
    scale: float

    @property
    def max_query_len(self) -> int:
        return int((self.query_start_loc[1:] - self.query_start_loc[:-1]).max()) if len(self.seq_lens) else 0


def make_batch(seq_lens: list[int], query_lens: list[int], num_heads: int, num_kv_heads: int,
               head_dim: int, block_size: int, dtype: torch.dtype, device: torch.device,
               seed: int = 0) -> PagedBatch:
    """Sequence i has ``seq_lens[i]`` keys in the cache, the last ``query_lens[i]`` of them queried."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3             # spare blocks hold noise nobody may read
    order = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(blocks_per_seq, default=0) + 1       # one padding column of 0s
    tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    for i, nb in enumerate(blocks_per_seq):
        tables[i, :nb] = torch.tensor(order[:nb], dtype=torch.int32)
        order = order[nb:]
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(query_lens, dtype=torch.int32).cumsum(0)
    q = torch.randn(int(qsl[-1]), num_heads, head_dim, generator=gen).to(dtype)
    return PagedBatch(q.to(device), k_cache.to(device), v_cache.to(device), tables.to(device),
                      qsl.to(device), torch.tensor(seq_lens, dtype=torch.int32, device=device),
                      head_dim ** -0.5)


def tiny_model(dtype: torch.dtype, seed: int = 0, std: float = 0.3, **shape: object) -> LlamaForCausalLM:
    """2 layers, 6 query heads over 2 KV heads (GQA 3:1), vocabulary 97; weights of std ``std``;
    ``shape`` overrides config fields."""
    arch = ArchConfig.from_hf_dict(dict(
        model_type="llama", hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, head_dim=16, vocab_size=97,
        max_position_embeddings=64) | shape)
    gen = torch.Generator().manual_seed(seed)
    model = LlamaForCausalLM(arch)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=gen)
        p.data = (1 + 0.1 * noise if "norm" in name else std * noise).to(dtype)
    return model.eval().requires_grad_(False)

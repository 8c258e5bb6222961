"""The Llama family (Llama, SmolLM2, Qwen2, Qwen3) over a flat batch of tokens and a paged KV cache.

Differences between the families are fields of ``ArchConfig``: q/k/v bias (Qwen2), per-head q/k
RMSNorm before RoPE (Qwen3), tied embeddings, RoPE scaling. Inference only.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from shared.worker.attention.base import AttentionBackend
from shared.worker.attention.metadata import AttentionMetadata
from shared.worker.attention.torch_backend import TorchAttention
from shared.worker.models.arch_config import ArchConfig
from shared.worker.models.layers import (
    Embedding,
    GatedMLP,
    Linear,
    RMSNorm,
    RotaryEmbedding,
    VocabParallelEmbedding,
    apply_rope,
    vocab_shard_rows,
)

if TYPE_CHECKING:
    from shared.worker.distributed.group import TensorParallelGroup

KVCache = tuple[torch.Tensor, torch.Tensor]


class LlamaAttention(nn.Module):
    def __init__(self, arch: ArchConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.num_heads = arch.num_attention_heads
        self.num_kv_heads = arch.num_key_value_heads
        self.head_dim = arch.head_dim
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        # One matmul for q, k and v; the loader concatenates the three HF weights.
        self.qkv_proj = Linear(arch.hidden_size, q_size + 2 * kv_size, arch.attention_bias)
        self.o_proj = Linear(q_size, arch.hidden_size, arch.o_proj_bias)
        self.q_norm = RMSNorm(self.head_dim, arch.rms_norm_eps) if arch.use_qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, arch.rms_norm_eps) if arch.use_qk_norm else None
        self.backend = backend

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                plan: Any, kv_cache: KVCache) -> torch.Tensor:
        n, h, kvh, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x)
        v = qkv[:, (h + kvh) * d:].view(n, kvh, d)
        if self.q_norm is None:
            # q and k sit side by side in qkv: rotate both with one set of ops.
            q, k = apply_rope(qkv[:, :(h + kvh) * d].view(n, h + kvh, d), cos, sin).split([h, kvh], 1)
        else:
            q = self.q_norm(qkv[:, :h * d].view(n, h, d))
            k = self.k_norm(qkv[:, h * d:(h + kvh) * d].view(n, kvh, d))
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return self.o_proj(self.backend.forward(q, k, v, kv_cache, plan))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, arch: ArchConfig, backend: AttentionBackend,
                 tp: TensorParallelGroup | None = None) -> None:
        super().__init__()
        self.tp = tp    # o_proj and down_proj are row-parallel: their partial sums meet here
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.self_attn = LlamaAttention(arch, backend)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.mlp = GatedMLP(arch.hidden_size, arch.intermediate_size, arch.mlp_bias)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                plan: Any, kv_cache: KVCache) -> torch.Tensor:
        h = h + self._reduce(self.self_attn(self.input_layernorm(h), cos, sin, plan, kv_cache))
        return h + self._reduce(self.mlp(self.post_attention_layernorm(h)))

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.tp is None else self.tp.all_reduce(x)


class LlamaForCausalLM(nn.Module):
    """With ``tp``, ``arch`` is one rank's shard (heads and MLP width divided, vocabulary whole)
    and the embedding and lm_head hold this rank's block of vocabulary rows."""

    def __init__(self, arch: ArchConfig, tp: TensorParallelGroup | None = None) -> None:
        super().__init__()
        self.arch, self.tp = arch, tp
        self.attn_backend = TorchAttention(
            arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim, arch.head_dim ** -0.5)
        self.rotary = RotaryEmbedding(arch)
        vocab_rows = arch.vocab_size if tp is None else vocab_shard_rows(arch.vocab_size, tp.size)
        self.embed_tokens = (Embedding(vocab_rows, arch.hidden_size) if tp is None
                             else VocabParallelEmbedding(vocab_rows, arch.hidden_size, tp))
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(arch, self.attn_backend, tp) for _ in range(arch.num_hidden_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.lm_head = Linear(arch.hidden_size, vocab_rows, bias=False)
        if arch.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn_metadata: AttentionMetadata, kv_caches: list[KVCache]) -> torch.Tensor:
        """input_ids, positions [N] -> final-normed hidden states [N, hidden]."""
        h = self.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(positions, self.token_seq_lens(attn_metadata), h.dtype)
        plan = self.attn_backend.plan(attn_metadata)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h = layer(h, cos, sin, plan, kv_cache)
        return self.norm(h)

    def set_attention_backend(self, backend: AttentionBackend) -> None:
        """Swap the attention implementation of every layer (one backend object is shared)."""
        self.attn_backend = backend
        for layer in self.layers:
            layer.self_attn.backend = backend

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [M, hidden] -> float32 logits [M, vocab] (every rank gets all of them)."""
        logits = self.lm_head(hidden).float()
        if self.tp is None:
            return logits
        return self.tp.all_gather_last(logits)[:, :self.arch.vocab_size]

    def token_seq_lens(self, meta: AttentionMetadata) -> torch.Tensor | None:
        """Each token's sequence length after this step: only dynamic NTK RoPE reads it, so
        None (no work) for every other RoPE."""
        if not self.rotary.is_dynamic:
            return None
        return torch.repeat_interleave(
            meta.seq_lens.long(), torch.tensor(meta.query_lens_list, device=meta.seq_lens.device))

"""The one small interface every attention backend satisfies (torch on CPU, Triton on CUDA).

A backend is stateless and shared by all layers: ``plan`` runs once per step on the metadata,
``forward`` once per layer with that layer's cache pair and the step's plan.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from shared.worker.attention.metadata import AttentionMetadata


@runtime_checkable
class AttentionBackend(Protocol):
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float

    def plan(self, meta: AttentionMetadata) -> Any:
        """Everything that depends only on the step's metadata, built once for all layers."""
        ...

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], plan: Any) -> torch.Tensor:
        """q [N, H, D], k/v [N, KVH, D] (RoPE applied): write k/v to the cache, return [N, H * D]."""
        ...

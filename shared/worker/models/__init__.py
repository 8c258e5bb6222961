"""Model implementations: the Llama family over a flat token batch and a paged KV cache."""
from __future__ import annotations

from shared.worker.models.arch_config import ArchConfig
from shared.worker.models.llama import LlamaForCausalLM

__all__ = ["ArchConfig", "LlamaForCausalLM"]

"""Small building blocks of the Llama family: RMSNorm, rotary embedding, SwiGLU MLP.

Each one reproduces transformers' arithmetic order and dtypes, so float32 logits match to ~1e-5.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from shared.worker.models.arch_config import ArchConfig

if TYPE_CHECKING:
    from shared.worker.distributed.group import TensorParallelGroup


class Linear(nn.Module):
    """``y = x W^T + b`` with uninitialised weights: the loader fills them, so skipping torch's
    random init saves seconds (on meta tensors it even imports torch._dynamo)."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


def vocab_shard_rows(vocab_size: int, size: int) -> int:
    """Rows of each tensor-parallel rank's vocabulary block (the last one padded)."""
    return -(-vocab_size // size)


class VocabParallelEmbedding(nn.Module):
    """One tensor-parallel rank's block of embedding rows: ids outside it look up zeros, and
    the all-reduce puts each token's one real row back together."""

    def __init__(self, rows: int, dim: int, tp: TensorParallelGroup) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, dim))
        self.first, self.rows, self.tp = tp.rank * rows, rows, tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.first
        outside = (local < 0) | (local >= self.rows)
        h = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(h.masked_fill(outside[:, None], 0))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 and cast back before the weight multiply, as HF does.
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class GatedMLP(nn.Module):
    """SwiGLU with gate and up fused into one matmul: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, hidden: int, intermediate: int, bias: bool) -> None:
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias)
        self.down_proj = Linear(intermediate, hidden, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class RotaryEmbedding:
    """cos/sin tables computed per step from the positions (no max-length cache to size or grow).

    A plain object, not an ``nn.Module``: the loader builds the model on the meta device, and
    inverse frequencies must stay real numbers computed in float32.
    """

    def __init__(self, arch: ArchConfig) -> None:
        self.head_dim = arch.head_dim
        self.theta = arch.rope_theta
        self.scaling = arch.rope_scaling or {"rope_type": "default"}
        self.max_positions = arch.max_position_embeddings
        self.inv_freq, self.attention_factor = _static_inv_freq(self.theta, self.head_dim, self.scaling)
        self.is_dynamic = self.scaling["rope_type"] == "dynamic"

    def cos_sin(self, positions: torch.Tensor, token_seq_lens: torch.Tensor | None,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Return cos, sin of shape [N, head_dim] in ``dtype``.

        ``token_seq_lens`` (each token's sequence length after this step) is only read by dynamic
        NTK, which picks its base per sequence as transformers does for one sequence.
        """
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        if self.is_dynamic and token_seq_lens is not None:
            inv_freq = self._dynamic_inv_freq(token_seq_lens)        # [N, dim/2]
        else:
            inv_freq = self.inv_freq[None, :]
        freqs = positions[:, None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_factor
        sin = emb.sin() * self.attention_factor
        return cos.to(dtype), sin.to(dtype)

    def _dynamic_inv_freq(self, seq_lens: torch.Tensor) -> torch.Tensor:
        dim, factor = self.head_dim, float(self.scaling["factor"])
        length = seq_lens.to(torch.float64).clamp(min=self.max_positions)
        base = self.theta * ((factor * length / self.max_positions) - (factor - 1)) ** (dim / (dim - 2))
        exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=seq_lens.device).float() / dim
        return 1.0 / (base.float()[:, None] ** exponents[None, :])


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on x [N, heads, head_dim] with cos/sin [N, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def _default_inv_freq(theta: float, dim: int) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    return 1.0 / (theta ** exponents)


def _static_inv_freq(theta: float, dim: int, scaling: dict[str, Any]) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and cos/sin scale for the position-independent RoPE variants."""
    rope_type = scaling["rope_type"]
    inv_freq = _default_inv_freq(theta, dim)
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"]), 1.0
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling), 1.0
    if rope_type == "yarn":
        return _yarn_inv_freq(theta, dim, scaling)
    return inv_freq, 1.0   # default, and dynamic below its original length


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_len = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are slowed by `factor`, short ones kept, the band between blended smoothly.
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_medium, blended, scaled)


def _yarn_inv_freq(theta: float, dim: int, s: dict[str, Any]) -> tuple[torch.Tensor, float]:
    orig_len = float(s["original_max_position_embeddings"])
    factor = float(s["factor"])
    attn_factor = s.get("attention_factor")
    if attn_factor is None:
        mscale, mscale_all = s.get("mscale"), s.get("mscale_all_dim")
        attn_factor = (_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
                       if mscale and mscale_all else _yarn_mscale(factor, 1.0))
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(orig_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001   # avoid a zero-width ramp
    pos_freqs = theta ** (torch.arange(0, dim, 2, device="cpu").float() / dim)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate
    return inv_freq, float(attn_factor)


def _yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

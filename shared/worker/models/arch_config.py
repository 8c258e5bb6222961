"""The model architecture, read from an HF ``config.json``.

One flat dataclass for every supported family (Llama / SmolLM2, Qwen2, Qwen3), so the model code
branches on plain fields (``attention_bias``, ``use_qk_norm``) and never on ``model_type``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


@dataclass(frozen=True)
class ArchConfig:
    model_type: str
    architectures: list[str]
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    # None for plain RoPE; otherwise the HF parameter dict, always with a "rope_type" key.
    rope_scaling: dict[str, Any] | None
    tie_word_embeddings: bool
    attention_bias: bool        # bias on q/k/v projections
    o_proj_bias: bool           # bias on the output projection (llama/qwen3 follow attention_bias)
    mlp_bias: bool
    use_qk_norm: bool           # qwen3: RMSNorm over each q/k head before RoPE
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}")
        if self.hidden_act != "silu":
            raise ValueError(f"unsupported hidden_act {self.hidden_act!r}: only 'silu' (SwiGLU)")

    @property
    def rope_type(self) -> str:
        return "default" if self.rope_scaling is None else self.rope_scaling["rope_type"]

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @classmethod
    def from_folder(cls, folder: str | Path) -> ArchConfig:
        path = Path(folder) / "config.json"
        with open(path, encoding="utf-8") as f:
            return cls.from_hf_dict(json.load(f))

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ArchConfig:
        model_type = d.get("model_type", "")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
        if d.get("use_sliding_window"):
            raise ValueError("sliding-window attention (use_sliding_window=true) is not supported")
        hidden, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
        rope_theta, rope_scaling = _parse_rope(d)
        # Qwen2 hard-wires bias on q/k/v (never on o); llama and qwen3 read attention_bias for all four.
        qkv_bias = True if model_type == "qwen2" else bool(d.get("attention_bias", False))
        o_bias = False if model_type == "qwen2" else qkv_bias
        return cls(
            model_type=model_type,
            architectures=list(d.get("architectures") or []),
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_hidden_layers=int(d["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or hidden // heads),
            vocab_size=int(d["vocab_size"]),
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=qkv_bias,
            o_proj_bias=o_bias,
            mlp_bias=bool(d.get("mlp_bias", False)),
            use_qk_norm=model_type == "qwen3",
            hidden_act=d.get("hidden_act", "silu"),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=_as_id_list(d.get("eos_token_id")),
        )


def _as_id_list(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _parse_rope(d: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """Read transformers-5 ``rope_parameters`` or the older ``rope_theta`` + ``rope_scaling`` pair."""
    params = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", d.get("rope_theta", 10000.0)))
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"unsupported rope_type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    if rope_type == "default":
        return theta, None
    if rope_type in ("llama3", "yarn"):
        # As transformers does: the pretraining length defaults to max_position_embeddings.
        params.setdefault("original_max_position_embeddings",
                          d.get("original_max_position_embeddings", d.get("max_position_embeddings")))
    return theta, {"rope_type": rope_type, **params}

"""The overhead-bound model setting: a tiny random-weight Llama with the real tokenizer.

Its forward pass costs almost nothing, so what the harness measures is the CPU work around it
(HTTP, scheduling, input preparation, detokenization, IPC). Built once from a fixed seed into
the twinserve cache; the tokenizer files are copied from the default model so prompts,
chat templates and detokenization behave exactly as with the real model.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

TINY_SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128, "head_dim": 16}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "generation_config.json", "special_tokens_map.json")
_DONE = ".twinserve-complete"


def tiny_model_dir(seed: int = 0) -> Path:
    from shared.worker.model_fetch import cache_dir

    return cache_dir() / "models" / f"tiny-random-llama-s{seed}"


def ensure_tiny_model(source: Path, seed: int = 0) -> Path:
    """Return the tiny model folder, writing it on first use (atomically, via a rename)."""
    target = tiny_model_dir(seed)
    if (target / _DONE).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=target.parent))
    try:
        config = tiny_config(json.loads((source / "config.json").read_text(encoding="utf-8")))
        (tmp / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        write_random_weights(tmp / "model.safetensors", config, seed)
        for name in TOKENIZER_FILES:
            if (source / name).exists():
                shutil.copy2(source / name, tmp / name)
        (tmp / _DONE).touch()
        try:
            os.rename(tmp, target)
        except OSError:  # another process won the race; its folder is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def tiny_config(real: dict[str, object]) -> dict[str, object]:
    """The real model's config with a tiny shape; vocabulary and special ids are kept."""
    cfg = dict(real) | TINY_SHAPE
    cfg |= {"tie_word_embeddings": True, "model_type": "llama",
            "architectures": ["LlamaForCausalLM"], "dtype": "float32",
            "_model_name_or_path": "twinserve tiny random llama"}
    cfg.pop("torch_dtype", None)
    return cfg


def write_random_weights(path: Path, cfg: dict[str, object], seed: int) -> None:
    """HF-named Llama weights, N(0, 0.02) matrices and unit norms, from ``seed``."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    h, inter = int(cfg["hidden_size"]), int(cfg["intermediate_size"])  # type: ignore[arg-type]
    hd = int(cfg["head_dim"])  # type: ignore[arg-type]
    q, kv = int(cfg["num_attention_heads"]) * hd, int(cfg["num_key_value_heads"]) * hd  # type: ignore[arg-type]

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.02

    tensors = {"model.embed_tokens.weight": randn(int(cfg["vocab_size"]), h),  # type: ignore[arg-type]
               "model.norm.weight": torch.ones(h)}
    for i in range(int(cfg["num_hidden_layers"])):  # type: ignore[arg-type]
        p = f"model.layers.{i}."
        tensors |= {
            p + "self_attn.q_proj.weight": randn(q, h), p + "self_attn.k_proj.weight": randn(kv, h),
            p + "self_attn.v_proj.weight": randn(kv, h), p + "self_attn.o_proj.weight": randn(h, q),
            p + "mlp.gate_proj.weight": randn(inter, h), p + "mlp.up_proj.weight": randn(inter, h),
            p + "mlp.down_proj.weight": randn(h, inter),
            p + "input_layernorm.weight": torch.ones(h),
            p + "post_attention_layernorm.weight": torch.ones(h),
        }
    save_file(tensors, str(path), metadata={"format": "pt"})

"""Load an HF-format folder (config.json + safetensors) into ``LlamaForCausalLM``; size KV caches.

HF names map onto ours one to one, except two fusions done here:
    q_proj, k_proj, v_proj  -> self_attn.qkv_proj   (rows concatenated in that order)
    gate_proj, up_proj      -> mlp.gate_up_proj
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open

from shared.config import EngineConfig
from shared.worker.distributed.sharding import shard_arch, shard_tensor
from shared.worker.models.arch_config import ArchConfig
from shared.worker.models.llama import LlamaForCausalLM

if TYPE_CHECKING:
    from shared.worker.distributed.group import TensorParallelGroup

_FUSED = {  # our parameter suffix -> HF suffixes concatenated along dim 0
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
# Checkpoint entries that carry nothing we need.
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")


def load_model(folder: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu",
               tp: TensorParallelGroup | None = None) -> LlamaForCausalLM:
    """The model, or with ``tp`` this rank's shard of it (each tensor cut before fusion)."""
    folder = Path(folder)
    arch = ArchConfig.from_folder(folder)
    if tp is not None:
        arch = shard_arch(arch, tp.size)
    # Build on the meta device (no random init, no allocation), then give every parameter its
    # checkpoint tensor, converted once: no allocate-then-copy of 0.5 GB.
    with torch.device("meta"):
        model = LlamaForCausalLM(arch, tp)
    tensors = _read_safetensors(folder)
    if tp is not None:
        tensors = {n: shard_tensor(n, t, tp.rank, tp.size) for n, t in tensors.items()}
    _fill_parameters(model, tensors, arch, dtype, torch.device(device))
    if arch.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model.eval().requires_grad_(False)


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of an HF model folder."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        with open(index, encoding="utf-8") as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [folder / name for name in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    return files


def _read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in checkpoint_files(folder):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
    return tensors


def _hf_sources(name: str) -> list[str]:
    """The HF checkpoint names that make up one of our parameters."""
    if name.startswith("lm_head."):
        return [name]
    for ours, theirs in _FUSED.items():
        if ours in name:
            return ["model." + name.replace(ours, part) for part in theirs]
    return ["model." + name]


def _fill_parameters(model: LlamaForCausalLM, tensors: dict[str, torch.Tensor], arch: ArchConfig,
                     dtype: torch.dtype, device: torch.device) -> None:
    used: set[str] = set()
    for name, param in list(model.named_parameters()):   # tied parameters are listed once
        if name == "lm_head.weight" and arch.tie_word_embeddings:
            continue
        sources = _hf_sources(name)
        missing = [s for s in sources if s not in tensors]
        if missing:
            raise KeyError(f"checkpoint lacks {missing} (needed for {name})")
        if len(sources) > 1:
            value = torch.cat([tensors[s].to(device=device, dtype=dtype) for s in sources])
        else:
            # copy=True: own the memory rather than alias the file mapping, which a rewrite of the
            # checkpoint on disk would turn into a crash.
            value = tensors[sources[0]].to(device=device, dtype=dtype, copy=True)
        if value.shape != param.shape:
            raise ValueError(f"{name}: checkpoint shape {tuple(value.shape)} != {tuple(param.shape)}")
        owner_name, _, attr = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        owner._parameters[attr] = torch.nn.Parameter(value, requires_grad=False)
        used.update(sources)
    leftover = [n for n in tensors if n not in used and not _IGNORED.match(n)
                and not (arch.tie_word_embeddings and n == "lm_head.weight")]
    if leftover:
        raise ValueError(f"checkpoint has weights this model does not use: {leftover[:5]}")


def kv_bytes_per_block(arch: ArchConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers, K and V together."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * arch.num_hidden_layers * block_size * arch.num_key_value_heads * arch.head_dim * elem


def allocate_kv_caches(arch: ArchConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                       device: str | torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One (k, v) pair per layer, each [num_blocks, block_size, num_kv_heads, head_dim].

    Zero-filled, not empty: masked-out padding slots are still read, and garbage NaNs there
    would leak through the softmax (0 * NaN = NaN).
    """
    shape = (num_blocks, block_size, arch.num_key_value_heads, arch.head_dim)
    return [(torch.zeros(shape, dtype=dtype, device=device),
             torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(arch.num_hidden_layers)]


def activation_reserve_bytes(config: EngineConfig, hidden: int, inter: int, vocab: int,
                             qkv: int, dtype: torch.dtype) -> int:
    """GPU memory kept out of the KV cache for one step's activations, logits, sampler and CUDA
    graphs: a generous estimate (x2) plus 512 MiB for cuBLAS workspaces and fragmentation."""
    elem = torch.empty((), dtype=dtype).element_size()
    per_token = (4 * hidden + qkv + 3 * inter) * elem
    logits = config.scheduler.max_num_seqs * vocab * 4 * 3
    return 2 * (config.scheduler.max_num_batched_tokens * per_token + logits) + (512 << 20)

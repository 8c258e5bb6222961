"""The runner's backend selection and config checks, and greedy decoding through EngineCore with
the torch and the Triton backend (interpreter on CPU) giving the same tokens."""
from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest
import torch

from shared.config import CacheConfig, EngineConfig, ModelConfig
from shared.worker.model_loader import activation_reserve_bytes
from shared.worker.model_runner import resolve_attention_backend

TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 48,
        "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 6,
        "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 211, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": True}


def test_backend_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    assert resolve_attention_backend("auto", cpu) == "torch"
    assert resolve_attention_backend("auto", cpu, has_native=True) == "native"
    assert resolve_attention_backend("torch", cpu, has_native=True) == "torch"
    with pytest.raises(ValueError, match="native CPU kernels"):
        resolve_attention_backend("native", cpu)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    if importlib.util.find_spec("triton") is not None:
        with pytest.raises(ValueError, match="CUDA"):
            resolve_attention_backend("triton", cpu)


@pytest.mark.parametrize("bad", [{"attention_backend": "flash"}, {"gpu_memory_utilization": 0.0},
                                 {"gpu_memory_utilization": 1.5}])
def test_model_config_rejects(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ModelConfig(**bad)  # type: ignore[arg-type]


def test_activation_reserve_grows_with_the_batch() -> None:
    small = EngineConfig()
    big = EngineConfig()
    big.scheduler.max_num_batched_tokens *= 8
    args = (576, 1536, 49152, 15 * 64, torch.bfloat16)
    assert activation_reserve_bytes(big, *args) > activation_reserve_bytes(small, *args) > 512 << 20


def greedy(folder: Path, backend: str, prompts: list[list[int]], max_tokens: int,
           device: torch.device) -> list[list[int]]:
    from shared.engine_core import EngineCore
    from shared.messages import EngineCoreRequest, SamplingParams

    # On CUDA the Triton run also captures and replays decode graphs (enforce_eager is off).
    config = EngineConfig(model=ModelConfig(model=str(folder), dtype="float32", device=str(device),
                                            attention_backend=backend),
                          cache=CacheConfig(block_size=4, num_blocks=48))
    core = EngineCore(config, folder)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        core.add_request(EngineCoreRequest(str(i), p, params, None, time.time()))
    out: list[list[int]] = [[] for _ in prompts]
    while core.has_unfinished_requests():
        for o in core.step().outputs:
            out[int(o.request_id)] += o.new_token_ids
    return out


def test_engine_core_greedy_tokens_agree(tmp_path: Path, device: torch.device) -> None:
    pytest.importorskip("triton")
    from compare.tiny_model import write_random_weights

    (tmp_path / "config.json").write_text(json.dumps(TINY), encoding="utf-8")
    write_random_weights(tmp_path / "model.safetensors", TINY, seed=3)
    prompts = [[5, 9, 13, 2, 7, 1], [100, 3], [42] * 9]
    torch_out = greedy(tmp_path, "torch", prompts, 4, device)
    assert greedy(tmp_path, "triton", prompts, 4, device) == torch_out

"""What ``--kv-cache-dtype auto`` picks on this CPU: bf16 where the weights are quantized and
the native attention reads a bf16 cache of the model's shape with its AVX-512 tile; the
model's dtype elsewhere, and always under ``--quantization none`` (the exact path)."""
from __future__ import annotations

from pathlib import Path

import torch

from shared.config import CacheConfig, EngineConfig, ModelConfig
from shared.worker.model_runner import ModelRunner


def test_auto_kv_cache_is_bf16_exactly_where_the_native_tile_reads_it(default_model_dir: str) -> None:
    for quantization in ("auto", "none"):
        config = EngineConfig(model=ModelConfig(model=default_model_dir, quantization=quantization),
                              cache=CacheConfig(num_blocks=16))
        runner = ModelRunner(config, Path(default_model_dir))
        try:
            fast = runner.native is not None and runner.native.fast_bf16_attention(64, 3)
            assert fast == (runner.native is not None and runner.native.isa == "avx512")
            want = torch.bfloat16 if fast and quantization == "auto" else runner.dtype
            assert runner.kv_dtype == want
            assert runner.kv_caches[0][0].dtype == want
        finally:
            runner.close()

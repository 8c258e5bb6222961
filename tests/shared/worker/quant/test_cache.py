"""The quantized-weight cache: a warm start gives the same layers as quantizing, and a changed
checkpoint, dispatch or damaged entry quantizes again."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from shared.worker.native.build import load_native
from shared.worker.quant import cache as quant_cache
from shared.worker.quant.linear import Dispatch, QuantLinear
from shared.worker.quant.policy import _quantize_cached
from tests.kernels import helpers

DISPATCH = Dispatch(((1, "int4"), (8, "int8"), (32, "w8a8"), (sys.maxsize, "none")))


def _model() -> torch.nn.Module:
    return helpers.tiny_model(torch.float32, std=0.05, hidden_size=64, intermediate_size=128,
                              num_attention_heads=4, vocab_size=128)


def _layers(model: torch.nn.Module) -> dict[str, QuantLinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}


@pytest.fixture()
def checkpoint(tmp_path: Path) -> list[Path]:
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"stand-in for the checkpoint: only its name, size and mtime are keyed")
    return [f]


@pytest.mark.parametrize("native", [False, True])
def test_a_warm_start_gives_the_same_layers(tmp_path: Path, checkpoint: list[Path],
                                            native: bool) -> None:
    kernels = load_native(tmp_path / "native") if native else None
    cache = (tmp_path / "quantized", checkpoint)
    cold, warm = _model(), _model()
    n_cold = _quantize_cached(cold, DISPATCH, torch.float32, kernels, False, cache)
    assert len(list((tmp_path / "quantized").glob("*.safetensors"))) == 1
    # The warm model's own weights are never packed: zero its linears to prove it.
    for m in warm.modules():
        if hasattr(m, "weight") and m.weight.dim() == 2 and m is not warm.embed_tokens:
            m.weight.data.zero_()
    n_warm = _quantize_cached(warm, DISPATCH, torch.float32, kernels, False, cache)
    assert n_warm == n_cold
    gen = torch.Generator().manual_seed(0)
    for name, layer in _layers(cold).items():
        twin = _layers(warm)[name]
        assert twin.dispatch == layer.dispatch and set(twin.formats) == set(layer.formats)
        k = next(iter(layer.formats.values())).in_features
        for rows in (1, 4, 16):     # int4, int8, w8a8: every packed format
            xs = torch.randn(rows, k, generator=gen)
            assert torch.equal(twin(xs), layer(xs)), (name, rows)


def test_the_key_follows_checkpoint_dispatch_and_dtype(checkpoint: list[Path]) -> None:
    key = quant_cache.cache_key(checkpoint, DISPATCH, torch.float32, False)
    assert key == quant_cache.cache_key(checkpoint, DISPATCH, torch.float32, False)
    assert key != quant_cache.cache_key(checkpoint, Dispatch.single("int8"), torch.float32, False)
    assert key != quant_cache.cache_key(checkpoint, DISPATCH, torch.bfloat16, False)
    assert key != quant_cache.cache_key(checkpoint, DISPATCH, torch.float32, True)
    st = checkpoint[0].stat()
    os.utime(checkpoint[0], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert key != quant_cache.cache_key(checkpoint, DISPATCH, torch.float32, False)


def test_a_damaged_entry_quantizes_again(tmp_path: Path, checkpoint: list[Path],
                                         caplog: pytest.LogCaptureFixture) -> None:
    cache = (tmp_path / "quantized", checkpoint)
    _quantize_cached(_model(), DISPATCH, torch.float32, None, False, cache)
    entry = next((tmp_path / "quantized").glob("*.safetensors"))
    entry.write_bytes(entry.read_bytes()[:100])
    model = _model()
    assert _quantize_cached(model, DISPATCH, torch.float32, None, False, cache) > 0
    assert "unreadable" in caplog.text
    assert all(isinstance(model.get_submodule(n), QuantLinear) for n in _layers(model))
    assert quant_cache.load(_model(), entry, torch.float32, None) is not None   # rewritten


def test_a_shape_the_formats_refuse_round_trips_as_its_float_weight(
        tmp_path: Path, checkpoint: list[Path]) -> None:
    """48 columns: w8a8 and int4 keep the float weight under their names; the cache stores
    nothing for it and rebuilds the same layer (CI failed saving one)."""
    cache = (tmp_path / "quantized", checkpoint)
    dispatch = Dispatch(((1, "int4"), (sys.maxsize, "w8a8")))
    cold, warm = helpers.tiny_model(torch.float32), helpers.tiny_model(torch.float32)
    n_cold = _quantize_cached(cold, dispatch, torch.float32, None, False, cache)
    assert len(list((tmp_path / "quantized").glob("*.safetensors"))) == 1
    assert _quantize_cached(warm, dispatch, torch.float32, None, False, cache) == n_cold
    gen = torch.Generator().manual_seed(0)
    for name, layer in _layers(cold).items():
        twin = _layers(warm)[name]
        assert {f: type(v) for f, v in twin.formats.items()} == \
            {f: type(v) for f, v in layer.formats.items()}
        x = torch.randn(3, next(iter(layer.formats.values())).in_features, generator=gen)
        assert torch.equal(twin(x), layer(x)), name
    kinds = {type(layer.formats["w8a8"]).__name__ for layer in _layers(cold).values()}
    assert kinds == {"Dense", "W8A8"}      # both kinds of layer went through the cache

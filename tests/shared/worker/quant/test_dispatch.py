"""``--quantization auto``: the measured crossover, the per-call choice, and the whole model."""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from shared.config import CacheConfig
from shared.worker.models.layers import Linear
from shared.worker.native.build import load_native
from shared.worker.quant import tuning
from shared.worker.quant.formats import pack
from shared.worker.quant.int4 import Int4
from shared.worker.quant.linear import Dispatch, QuantLinear, quantize_model
from shared.worker.quant.policy import apply_quantization, checkpoint_is_int4, resolve_dtype, resolve_kv_dtype
from tests.kernels import helpers


def tiny_model(dtype: torch.dtype) -> torch.nn.Module:
    """hidden 64 (int4 groups of 32 fit), GQA 2:1, vocabulary 101, weights of std 0.05."""
    return helpers.tiny_model(dtype, std=0.05, hidden_size=64, intermediate_size=128,
                              num_attention_heads=4, vocab_size=101)


def test_dispatch_picks_the_first_range_that_holds_the_rows() -> None:
    d = Dispatch(((4, "int8"), (64, "w8a8"), (sys.maxsize, "none")))
    assert [d.format_for(m) for m in (1, 4, 5, 64, 65, 4096)] == \
        ["int8", "int8", "w8a8", "w8a8", "none", "none"]
    assert d.formats == ["int8", "w8a8", "none"]
    assert d.describe() == "int8 for 1-4 rows, w8a8 for 5-64 rows, none from 65 rows"


def test_dispatch_from_measured_times_follows_the_fastest() -> None:
    times = {"none": {1: 9.0, 8: 9.5, 64: 10.0, 256: 30.0},
             "int8": {1: 2.0, 8: 4.0, 64: 20.0, 256: 80.0},
             "w8a8": {1: 5.0, 8: 6.0, 64: 8.0, 256: 25.0}}
    d = tuning.dispatch_from(times)
    assert d.ranges == ((8, "int8"), (sys.maxsize, "w8a8"))
    assert tuning.dispatch_from({"none": {1: 1.0, 8: 1.0}}).formats == ["none"]


@dataclass
class _Counting:
    """A weight format that counts its calls (wraps a real one)."""
    inner: object
    calls: int = 0
    name: str = "counting"

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.inner.matmul(x)

    @property
    def nbytes(self) -> int:
        return 0


def test_quant_linear_chooses_by_row_count_and_adds_bias() -> None:
    w, b = torch.randn(8, 32), torch.randn(8)
    small, large = _Counting(pack("int8", w, torch.float32)), _Counting(pack("none", w, torch.float32))
    layer = QuantLinear({"int8": small, "none": large}, b, Dispatch(((2, "int8"), (sys.maxsize, "none"))))
    x = torch.randn(3, 32)
    torch.testing.assert_close(layer(x), x @ w.t() + b)
    layer(x[:2])
    assert (small.calls, large.calls) == (1, 1)


def _logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    from tests.shared.worker.test_model import BlockPool, new_caches, run_step

    seq = BlockPool(16).seq(ids)
    run_step(model, new_caches(model), [(seq, len(ids))])
    return seq.logits[0]


@pytest.mark.parametrize("mode", ["int8", "int4", "w8a8", "mixed"])
def test_quantized_tiny_model_stays_close_to_float(mode: str) -> None:
    ids = list(range(3, 35))
    ref = _logits(tiny_model(torch.float32), ids)
    model = tiny_model(torch.float32)
    dispatch = (Dispatch(((8, "int8"), (sys.maxsize, "none"))) if mode == "mixed"
                else Dispatch.single(mode))
    quantize_model(model, dispatch, torch.float32)
    assert not any(isinstance(m, Linear) for m in model.modules())
    assert isinstance(model.lm_head, QuantLinear)
    got = _logits(model, ids)
    rel = ((got - ref).abs().max() / ref.abs().max()).item()
    assert rel < {"int8": 0.03, "int4": 0.3, "w8a8": 0.05, "mixed": 0.03}[mode], rel
    if mode == "mixed":   # 32 prompt rows took the float weights: the same as unquantized
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_tuned_dispatch_measures_once_then_reads_its_cache(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model(torch.float32)
    calls = []
    real_measure = tuning.measure

    def counting_measure(shapes, candidates, dtype, rows, native=None):  # noqa: ANN001
        calls.append(1)
        return real_measure(shapes, candidates, dtype, rows, native=native)
    monkeypatch.setattr(tuning, "measure", counting_measure)
    first = tuning.tuned_dispatch(model.arch, ["none", "int8"], torch.float32, tmp_path)
    second = tuning.tuned_dispatch(model.arch, ["none", "int8"], torch.float32, tmp_path)
    assert first == second and len(calls) == 1
    (cached,) = tmp_path.glob("quant-*.json")
    times = json.loads(cached.read_text())
    assert set(times) == {"none", "int8"} and all(t > 0 for d in times.values() for t in d.values())
    assert set(times["none"]) == {str(m) for m in tuning.ROWS}
    cached.write_text("not json")               # a broken cache is measured again, not fatal
    tuning.tuned_dispatch(model.arch, ["none", "int8"], torch.float32, tmp_path)   # timings vary
    assert len(calls) == 2 and set(json.loads(cached.read_text())) == {"none", "int8"}


def test_timing_reaches_past_the_native_kernels(tmp_path: Path) -> None:
    """Past the largest timed size the last winner keeps running, so the timing must see the
    weight-only formats leave the native kernels for torch's (an int8 GEMV winning at 64 rows
    says nothing about a 1,024-token prefill)."""
    native = load_native(tmp_path)
    assert native is not None
    assert max(tuning.ROWS) > native.max_rows


def test_linear_shapes_count_the_decoder_layers() -> None:
    shapes = tuning.linear_shapes(tiny_model(torch.float32).arch)
    # 2 layers of o, down, qkv (4 + 2 * 2 heads of 16), gate_up; the lm_head is left out
    assert shapes == [(64, 64, 2), (64, 128, 2), (128, 64, 2), (256, 64, 2)]


def test_apply_quantization_by_device() -> None:
    model = tiny_model(torch.float32)
    assert apply_quantization(model, "none", torch.float32, torch.device("cpu"), None) is None
    assert apply_quantization(model, "auto", torch.float32, torch.device("cuda"), None) is None
    with pytest.raises(ValueError, match="CPU only"):
        apply_quantization(model, "int8", torch.float32, torch.device("cuda"), None)
    assert isinstance(model.lm_head, Linear)        # nothing was touched
    d = apply_quantization(model, "int8", torch.float32, torch.device("cpu"), None)
    assert d == Dispatch.single("int8") and isinstance(model.lm_head, QuantLinear)


def test_a_shape_a_format_cannot_hold_keeps_its_float_weight() -> None:
    model = tiny_model(torch.float32)           # vocabulary 101: no int4 tile fits the lm_head
    quantize_model(model, Dispatch.single("int4"), torch.float32)
    assert model.lm_head.formats["int4"].name == "none"
    assert model.layers[0].mlp.down_proj.formats["int4"].name == "int4"


def test_a_format_far_behind_is_not_timed_at_larger_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    timed: list[tuple[str, int]] = []

    def fake_time(formats: list, xs: dict, m: int) -> float:
        name = formats[0].name
        timed.append((name, m))
        return {"none": 1.0, "int8": 10.0}[name] * m
    monkeypatch.setattr(tuning, "_time_layers", fake_time)
    times = tuning.measure([(32, 32, 1)], ["none", "int8"], torch.float32, rows=(1, 2, 4))
    assert timed == [("none", 1), ("int8", 1), ("none", 2), ("none", 4)]
    assert times["int8"][4] == float("inf") and tuning.dispatch_from(times).formats == ["none"]


def test_a_shape_a_format_refuses_is_timed_as_the_float_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    # The tiny model's 48 columns are no multiple of w8a8's group of 32: the model keeps those
    # layers dense, so the timing must too (it raised here and failed the engine's start).
    timed: list[list[str]] = []

    def fake_time(formats: list, xs: dict, m: int) -> float:
        timed.append([f.name for f in formats])
        return 1.0
    monkeypatch.setattr(tuning, "_time_layers", fake_time)
    times = tuning.measure([(48, 48, 1), (64, 64, 1)], ["none", "w8a8"], torch.float32, rows=(1,))
    assert timed == [["none", "none"], ["none", "w8a8"]]
    assert times["w8a8"][1] == 1.0


def test_dense_dtype_follows_the_measurement(monkeypatch: pytest.MonkeyPatch) -> None:
    arch = tiny_model(torch.float32).arch
    for fast in (torch.float32, torch.bfloat16):
        monkeypatch.setattr(tuning, "measured_times", lambda shapes, cands, dt, cache, rows, fast=fast:
                            {"none": {16: 1.0 if dt == fast else 2.0}})
        assert tuning.faster_dense_dtype(arch, None) == fast


def test_cpu_dtype_is_float32_with_the_native_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    arch = tiny_model(torch.float32).arch
    monkeypatch.setattr("shared.worker.quant.policy.faster_dense_dtype", lambda arch, cache: torch.bfloat16)
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu, arch, None, native=True) == torch.float32
    assert resolve_dtype("auto", cpu, arch, None, native=False) == torch.bfloat16   # measured
    assert resolve_dtype("bfloat16", cpu, arch, None, native=True) == torch.bfloat16
    assert resolve_dtype("auto", torch.device("cuda"), arch, None) == torch.bfloat16


def test_kv_cache_dtype_auto_and_triton_refusing_another() -> None:
    assert resolve_kv_dtype("auto", torch.float32, "native") == torch.float32
    assert resolve_kv_dtype("auto", torch.bfloat16, "triton") == torch.bfloat16
    assert resolve_kv_dtype("bfloat16", torch.float32, "native") == torch.bfloat16
    assert resolve_kv_dtype("bfloat16", torch.float32, "torch") == torch.bfloat16
    assert resolve_kv_dtype("bfloat16", torch.bfloat16, "triton") == torch.bfloat16
    # Where the native attention reads bf16 at full speed, auto halves the cache.
    assert resolve_kv_dtype("auto", torch.float32, "native", fast_bf16=True) == torch.bfloat16
    assert resolve_kv_dtype("auto", torch.float32, "torch", fast_bf16=True) == torch.float32
    assert resolve_kv_dtype("float32", torch.float32, "native", fast_bf16=True) == torch.float32
    with pytest.raises(ValueError, match="triton"):
        resolve_kv_dtype("float32", torch.bfloat16, "triton")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        CacheConfig(kv_cache_dtype="fp8")


def test_bf16_weights_under_float32_activations() -> None:
    w, x = torch.randn(48, 64), torch.randn(5, 64)
    fmt = pack("bf16", w, torch.float32)
    y = fmt.matmul(x)
    assert y.dtype == torch.float32 and fmt.weight.dtype == torch.bfloat16 and fmt.native_mat() is None
    torch.testing.assert_close(y, x.to(torch.bfloat16).float() @ fmt.dequantize().t(), atol=3e-2, rtol=3e-2)


def test_timing_stops_at_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tuning, "_time_layers", lambda layers, xs, m: 1.0)
    times = tuning.measure([(32, 32, 1)], ["none", "int8"], torch.float32, rows=(1, 2, 4), budget_s=0)
    assert times == {"none": {}, "int8": {}}
    times = tuning.measure([(32, 32, 1)], ["none", "int8"], torch.float32, rows=(1, 2), budget_s=60)
    assert set(times["none"]) == {1, 2}


def test_the_float_weights_are_never_pruned(monkeypatch: pytest.MonkeyPatch) -> None:
    """int8 wins small batches by far, dense wins large ones: both must be timed throughout."""
    monkeypatch.setattr(tuning, "_time_layers",
                        lambda layers, xs, m: {"none": 10.0 * m, "int8": 1.0 + 30 * (m - 1)}[layers[0].name])
    times = tuning.measure([(32, 32, 1)], ["none", "int8"], torch.float32, rows=(1, 2, 4))
    assert all(math.isfinite(t) for d in times.values() for t in d.values())
    assert tuning.dispatch_from(times).ranges == ((1, "int8"), (sys.maxsize, "none"))


def _as_int4_checkpoint(model: torch.nn.Module) -> None:
    """Round every decoder linear through int4, as a model dequantized from a Q4 file is."""
    for layer in model.layers:
        for m in layer.modules():
            if isinstance(m, Linear):
                m.weight.data = pack("int4", m.weight.data, torch.float32).dequantize()


def test_auto_takes_int4_only_for_a_4bit_checkpoint_and_only_where_exact(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[list[str]] = []

    def fake_tuned(arch, candidates, dtype, cache, native):
        asked.append(list(candidates))
        return Dispatch(((8, "int4"), (sys.maxsize, "none"))) if "int4" in candidates \
            else Dispatch.single("none")

    monkeypatch.setattr("shared.worker.quant.policy.tuned_dispatch", fake_tuned)
    plain = tiny_model(torch.float32)
    assert not checkpoint_is_int4(plain)
    assert apply_quantization(plain, "auto", torch.float32, torch.device("cpu"), None) is None
    model = helpers.tiny_model(torch.float32, std=0.05, hidden_size=64, intermediate_size=128,
                               num_attention_heads=4, vocab_size=128)     # int4 fits the lm_head
    _as_int4_checkpoint(model)
    assert checkpoint_is_int4(model)
    d = apply_quantization(model, "auto", torch.float32, torch.device("cpu"), None)
    assert "int4" in asked[-1] and "int4" not in asked[0] and d.format_for(1) == "int4"
    assert "bf16" in asked[-1]          # float32 activations: bf16 weights may win batched steps
    qkv = model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv.formats["int4"], Int4) and qkv.dispatch.format_for(1) == "int4"
    # The (tied) lm_head is a float weight int4 would round: int8 there instead.
    lm_head = model.lm_head
    assert lm_head.dispatch.format_for(1) == "int8" and set(lm_head.formats) == {"int8", "none"}
    # With w8a8 in the dispatch (a VNNI CPU), it stands in for int4 instead.
    monkeypatch.setattr("shared.worker.quant.policy.tuned_dispatch", lambda *a: Dispatch(
        ((8, "int4"), (64, "w8a8"), (sys.maxsize, "none"))))
    model = helpers.tiny_model(torch.float32, std=0.05, hidden_size=64, intermediate_size=128,
                               num_attention_heads=4, vocab_size=128)
    _as_int4_checkpoint(model)
    apply_quantization(model, "auto", torch.float32, torch.device("cpu"), None)
    assert model.layers[0].mlp.down_proj.dispatch.format_for(1) == "int4"
    lm_head = model.lm_head
    assert lm_head.dispatch.format_for(1) == "w8a8" and set(lm_head.formats) == {"w8a8", "none"}

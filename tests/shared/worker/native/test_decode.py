"""The fused native decode step against the eager model on the same weights and caches: ragged
contexts over shuffled blocks, every family's options (GQA, q/k/v bias, q/k norm), float32,
int8, int4 and W8A8 weights, float32 and bfloat16 caches, with and without the split of long
contexts between threads; steps of prompts, chunks and decode rows together, and past
native.max_rows with W8A8."""
from __future__ import annotations

import pytest
import torch

from shared.worker.attention.metadata import AttentionMetadata
from shared.worker.native.build import NativeKernels, load_native
from shared.worker.native.decode import FusedDecode, unsupported_reason
from shared.worker.quant.linear import Dispatch, quantize_model
from tests.kernels.helpers import tiny_model
from tests.shared.worker.native.test_attention import mixed_batch


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> NativeKernels:
    kernels = load_native(tmp_path_factory.mktemp("native"))
    assert kernels is not None
    return kernels


def decode_meta(seq_lens: list[int], block_size: int, seed: int) -> tuple[AttentionMetadata, int]:
    """One decode token per sequence at position seq_len - 1; blocks shuffled; tables padded."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(per_seq) + 2
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(seq_lens), max(per_seq) + 1, dtype=torch.int32)
    slots = []
    for i, (n, nb) in enumerate(zip(seq_lens, per_seq)):
        tables[i, :nb] = torch.tensor(order[:nb], dtype=torch.int32)
        order = order[nb:]
        pos = n - 1
        slots.append(int(tables[i, pos // block_size]) * block_size + pos % block_size)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc=torch.arange(len(seq_lens) + 1, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), block_tables=tables,
        block_size=block_size, query_lens_list=[1] * len(seq_lens), seq_lens_list=list(seq_lens))
    return meta, num_blocks


def random_caches(model: torch.nn.Module, num_blocks: int, block_size: int, seed: int,
                  dtype: torch.dtype = torch.float32) -> list:
    a, gen = model.arch, torch.Generator().manual_seed(seed)
    shape = (num_blocks, block_size, a.num_key_value_heads, a.head_dim)
    return [(torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype))
            for _ in range(a.num_hidden_layers)]


def run_both(model, native: NativeKernels, seq_lens: list[int], block_size: int, threads: int,
             seed: int = 0, kv_dtype: torch.dtype = torch.float32, max_positions: int = 0) -> None:
    """The eager reference writes this step's K/V with torch's bf16 rounding and widens the
    cache where it reads it: both sides then attend over the same numbers. ``max_positions``
    0: cos/sin computed per step, else looked up in FusedDecode's table."""
    meta, num_blocks = decode_meta(seq_lens, block_size, seed)
    eager_caches = random_caches(model, num_blocks, block_size, seed, kv_dtype)
    fused_caches = [(k.clone(), v.clone()) for k, v in eager_caches]
    ids = torch.randint(0, model.arch.vocab_size, (len(seq_lens),), generator=torch.Generator().manual_seed(seed))
    positions = torch.tensor([n - 1 for n in seq_lens])
    with torch.inference_mode():
        expected = model(ids, positions, meta, eager_caches)
        fused = FusedDecode(model, fused_caches, native, threads, max_positions=max_positions)
        assert (fused._rope is None) == (max_positions == 0 or model.rotary.is_dynamic)
        assert fused.can_run(meta)
        got = fused.run(ids, positions, meta)
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=2e-4)
    for (ke, ve), (kf, vf) in zip(eager_caches, fused_caches):    # this step's K/V written alike
        assert kf.dtype == kv_dtype
        torch.testing.assert_close(kf, ke, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(vf, ve, atol=1e-5, rtol=1e-5)


FAMILIES = {
    "llama": {},
    "qwen2": {"model_type": "qwen2"},                       # q/k/v bias
    "qwen3": {"model_type": "qwen3"},                       # per-head q/k RMSNorm
    "mha-64": {"num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 64},
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seq_lens,block_size", [
    ([5], 16), ([1, 37, 200], 16), ([9, 3, 64, 17, 2, 80, 33, 128], 4),
    ([(7 * i) % 90 + 1 for i in range(21)], 16)])          # 21 rows: register tiles of 8, 8, 5
def test_fused_decode_matches_eager(native: NativeKernels, family: str, seq_lens: list[int],
                                    block_size: int) -> None:
    model = tiny_model(torch.float32, seed=len(seq_lens), std=0.1, **FAMILIES[family])
    run_both(model, native, seq_lens, block_size, threads=2, max_positions=256)


@pytest.mark.parametrize("scaling", [{"rope_type": "dynamic", "factor": 2.0},
                                     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 16}])
def test_scaled_rope_matches_eager(native: NativeKernels, scaling: dict) -> None:
    # Dynamic NTK's cos/sin depend on each sequence's length: computed per step, never tabled.
    model = tiny_model(torch.float32, seed=4, std=0.1, rope_scaling=scaling,
                       max_position_embeddings=32)
    run_both(model, native, [5, 70, 130], 16, threads=2, max_positions=256)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_bfloat16_cache_matches_eager(native: NativeKernels, family: str) -> None:
    # A bf16 cache under float32 activations (--kv-cache-dtype bfloat16): decode.c rounds the
    # step's K/V to nearest even as torch does, and attention.c widens what it reads.
    model = tiny_model(torch.float32, seed=7, std=0.1, **FAMILIES[family])
    run_both(model, native, [1, 37, 200, 9, 64], 16, threads=2, kv_dtype=torch.bfloat16)
    run_both(model, native, [700], 16, threads=3, kv_dtype=torch.bfloat16)     # split ranges


@pytest.mark.parametrize("threads", [1, 3])
def test_long_context_split_between_threads(native: NativeKernels, threads: int) -> None:
    # One sequence of 700 keys: attention.c splits it into ranges merged afterwards.
    run_both(tiny_model(torch.float32, seed=3, std=0.1), native, [700], 16, threads)


@pytest.mark.parametrize("fmt", ["int8", "int4", "w8a8"])
def test_quantized_weights_match_the_eager_quantized_model(native: NativeKernels, fmt: str) -> None:
    # One layer: the int4 kernel rounds activations to int8, so a 1e-7 difference between the
    # eager and fused inputs of a later layer can flip a rounding and move its output by 1e-3.
    model = tiny_model(torch.float32, seed=5, std=0.1, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=1)
    quantize_model(model, Dispatch.single(fmt), torch.float32, native)
    if fmt == "w8a8" and not native.vnni:       # no C path for W8A8 without VNNI: eager only
        meta, num_blocks = decode_meta([12, 40, 7], 16, 0)
        assert not FusedDecode(model, random_caches(model, num_blocks, 16, 0), native, 2).can_run(meta)
        return
    run_both(model, native, [12, 40, 7], 16, threads=2)


def test_steps_it_cannot_take(native: NativeKernels) -> None:
    model = tiny_model(torch.float32, std=0.1)
    meta, num_blocks = decode_meta([4] * (native.max_rows + 1), 16, 0)     # one row too many
    fused = FusedDecode(model, random_caches(model, num_blocks, 16, 0), native, 2)
    assert not fused.can_run(meta)
    few, _ = decode_meta([4] * 4, 16, 0)
    assert fused.can_run(few)
    few.query_lens_list = [2, 1, 1, 1]                           # a prefill chunk among decodes
    assert not fused.can_run(few)
    quantize_model(model, Dispatch.single("bf16"), torch.float32)   # no C path for bf16
    small, _ = decode_meta([4], 16, 0)
    assert not FusedDecode(model, random_caches(model, num_blocks, 16, 0), native, 2).can_run(small)
    bf16 = tiny_model(torch.bfloat16)
    assert "bfloat16" in unsupported_reason(bf16, random_caches(bf16, 2, 16, 0))
    fp16_cache = random_caches(model, 2, 16, 0, torch.float16)
    assert "KV cache" in unsupported_reason(tiny_model(torch.float32), fp16_cache)


def run_mixed(model, native: NativeKernels, seqs: list[tuple[int, int]], max_tokens: int,
              tol: float, flips: int = 0) -> None:
    """A step of any mix (seqs: context after the step, tokens new this step) fused and eager;
    ``flips``: rows allowed past ``tol``."""
    a = model.arch
    meta, (k, _) = mixed_batch(seqs, a.num_key_value_heads, a.head_dim, 16, torch.float32, seed=3)
    eager_caches = random_caches(model, k.shape[0], 16, seed=4)
    fused_caches = [(k.clone(), v.clone()) for k, v in eager_caches]
    ids = torch.randint(0, a.vocab_size, (meta.num_tokens,), generator=torch.Generator().manual_seed(5))
    positions = torch.tensor([p for n, q in seqs for p in range(n - q, n)])
    fused = FusedDecode(model, fused_caches, native, 2, max_tokens)
    assert fused.can_run(meta)
    with torch.inference_mode():
        expected = model(ids, positions, meta, eager_caches)
        got = fused.run(ids, positions, meta)
    if flips:   # int8 rounding: a 1e-7 difference can flip one group's rounding in a row
        off = ((got - expected).abs() > tol + tol * expected.abs()).any(1)
        assert off.sum() <= flips and (got - expected).norm() <= 2e-3 * expected.norm()
    else:
        torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
    for (ke, ve), (kf, vf) in zip(eager_caches, fused_caches):    # every new token's K/V
        torch.testing.assert_close(kf, ke, atol=tol, rtol=tol)
        torch.testing.assert_close(vf, ve, atol=tol, rtol=tol)


# Decode rows, a fresh prompt, chunks over a cached prefix and a one-token prompt, 53 tokens.
MIXED = [(40, 1), (30, 30), (70, 5), (9, 1), (100, 16), (1, 1)]


@pytest.mark.parametrize("family", FAMILIES)
def test_prompts_and_chunks_match_eager(native: NativeKernels, family: str) -> None:
    # Each token is a row with its sequence's table and position + 1 keys; all of the step's
    # K/V are in the cache before any row attends (the prompt's causal attention).
    model = tiny_model(torch.float32, seed=13, std=0.1, **FAMILIES[family])
    run_mixed(model, native, MIXED, max_tokens=64, tol=2e-4)


def test_a_step_past_max_rows_rounds_its_rows_once(native: NativeKernels) -> None:
    # 231 tokens: above native.max_rows the W8A8 GEMMs round the rows once, split between the
    # threads (decode.c's gemm_step); float weights are not taken there.
    seqs = [(200, 150), (40, 1), (9, 1), (64, 64), (80, 15)]
    model = tiny_model(torch.float32, seed=5, std=0.1, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=1)
    meta, (k, _) = mixed_batch(seqs, model.arch.num_key_value_heads, model.arch.head_dim, 16,
                               torch.float32, seed=3)
    assert not FusedDecode(model, random_caches(model, k.shape[0], 16, 0), native, 2, 256).can_run(meta)
    quantize_model(model, Dispatch.single("w8a8"), torch.float32, native)
    if not native.vnni:         # no C path for W8A8 without VNNI: eager only
        assert not FusedDecode(model, random_caches(model, k.shape[0], 16, 0), native, 2, 256).can_run(meta)
        return
    assert not FusedDecode(model, random_caches(model, k.shape[0], 16, 0), native, 2, 230).can_run(meta)
    run_mixed(model, native, seqs, max_tokens=256, tol=2e-4, flips=3)


def test_which_steps_take_prompts(native: NativeKernels) -> None:
    model = tiny_model(torch.float32, std=0.1)
    a = model.arch
    meta, (k, _) = mixed_batch(MIXED, a.num_key_value_heads, a.head_dim, 16, torch.float32, seed=3)
    caches = random_caches(model, k.shape[0], 16, 0)
    assert not FusedDecode(model, caches, native, 2).can_run(meta)          # decode steps only
    assert FusedDecode(model, caches, native, 2, max_tokens=53).can_run(meta)

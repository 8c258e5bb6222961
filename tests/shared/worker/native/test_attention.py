"""NativeAttention (attention.c reading the paged cache in place) against TorchAttention on the
same mixed batches: decode rows, short and long chunks over a cached prefix, fresh prompts,
GQA ratios, block sizes, float32 and bfloat16 caches, one thread and several, and the builds
without AVX-512 (head dim 64 with up to 4 query heads per KV head has its own AVX-512 tile)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.worker.attention.metadata import AttentionMetadata
from shared.worker.attention.native_backend import NATIVE_MAX_CONTEXT, NATIVE_MAX_QUERY, NativeAttention
from shared.worker.attention.torch_backend import TorchAttention
from shared.worker.native.build import NativeKernels, build, isa_flags, load_native


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> NativeKernels:
    kernels = load_native(tmp_path_factory.mktemp("native"))
    assert kernels is not None
    return kernels


def mixed_batch(seqs: list[tuple[int, int]], kvh: int, d: int, bs: int, dtype: torch.dtype,
                seed: int) -> tuple[AttentionMetadata, tuple[torch.Tensor, torch.Tensor]]:
    """Sequence i has context seqs[i][0] after this step, the last seqs[i][1] tokens new."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // bs) for n, _ in seqs]
    num_blocks = sum(per_seq) + 2
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(seqs), max(per_seq) + 1, dtype=torch.int32)
    slots = []
    for i, ((n, q), nb) in enumerate(zip(seqs, per_seq)):
        tables[i, :nb] = torch.tensor(order[:nb], dtype=torch.int32)
        order = order[nb:]
        slots += [int(tables[i, p // bs]) * bs + p % bs for p in range(n - q, n)]
    shape = (num_blocks, bs, kvh, d)
    caches = (torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype))
    qlens = [q for _, q in seqs]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc=torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32),
        seq_lens=torch.tensor([n for n, _ in seqs], dtype=torch.int32), block_tables=tables,
        block_size=bs, query_lens_list=qlens, seq_lens_list=[n for n, _ in seqs])
    return meta, caches


BATCHES = {
    "decode": [(1, 1), (37, 1), (200, 1), (16, 1), (17, 1)],
    "mixed": [(40, 1), (30, 30), (70, 5), (300, NATIVE_MAX_QUERY + 4), (9, 1), (100, NATIVE_MAX_QUERY),
              (NATIVE_MAX_CONTEXT + 60, 40), (NATIVE_MAX_CONTEXT + 1, NATIVE_MAX_CONTEXT + 1)],  # SDPA
    "long": [(1500, 1)],            # one pair per KV head: split between threads, then merged
}


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("heads,kvh,d,bs", [(6, 2, 16, 4), (9, 3, 64, 16), (8, 2, 64, 8), (10, 2, 64, 16),
                                            (4, 4, 32, 16), (16, 1, 8, 32)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_native_matches_torch(native: NativeKernels, batch: str, heads: int, kvh: int, d: int,
                              bs: int, threads: int) -> None:
    run(native, BATCHES[batch], heads, kvh, d, bs, threads, torch.float32, 1e-5)


@pytest.mark.parametrize("batch", ["decode", "mixed"])
def test_bfloat16_cache(native: NativeKernels, batch: str) -> None:
    run(native, BATCHES[batch], 9, 3, 64, 16, 2, torch.bfloat16, 2e-2)


@pytest.mark.parametrize("isa", ["AVX2", "scalar"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_builds_without_avx512(tmp_path_factory: pytest.TempPathFactory, isa: str,
                               dtype: torch.dtype, tol: float) -> None:
    cache: Path = tmp_path_factory.mktemp(f"native-{isa}")
    kernels = NativeKernels(build(cache, isa_flags(isa) if isa != "scalar" else []))
    assert not kernels.fast_bf16_attention(64, 3)      # so auto keeps the model's cache dtype
    for heads, kvh in ((9, 3), (8, 2)):
        run(kernels, BATCHES["mixed"], heads, kvh, 64, 16, 2, dtype, tol)


def test_the_fast_tile_takes_head_dim_64_and_up_to_4_heads_per_kv_head(native: NativeKernels) -> None:
    avx512 = native.isa == "avx512"
    assert native.fast_bf16_attention(64, 3) == avx512 and native.fast_bf16_attention(64, 4) == avx512
    assert not native.fast_bf16_attention(64, 5) and not native.fast_bf16_attention(128, 2)


def run(native: NativeKernels, seqs: list[tuple[int, int]], heads: int, kvh: int, d: int, bs: int,
        threads: int, dtype: torch.dtype, tol: float) -> None:
    meta, (k_cache, v_cache) = mixed_batch(seqs, kvh, d, bs, dtype, seed=heads + bs)
    gen = torch.Generator().manual_seed(1)
    n = meta.num_tokens
    q, k, v = (torch.randn(n, h, d, generator=gen).to(dtype) for h in (heads, kvh, kvh))
    ref_backend = TorchAttention(heads, kvh, d, d ** -0.5)
    got_backend = NativeAttention(heads, kvh, d, d ** -0.5, native, threads)
    ref_caches, got_caches = (k_cache.clone(), v_cache.clone()), (k_cache.clone(), v_cache.clone())
    ref = ref_backend.forward(q, k, v, ref_caches, ref_backend.plan(meta))
    plan = got_backend.plan(meta)
    got = got_backend.forward(q, k, v, got_caches, plan)
    torch.testing.assert_close(got.float(), ref.float(), atol=tol, rtol=tol)
    assert torch.equal(got_caches[0], ref_caches[0]) and torch.equal(got_caches[1], ref_caches[1])
    # which rows took the kernel: short chunks and short contexts, prompts or not
    native_rows = sum(q for n, q in seqs if q <= NATIVE_MAX_QUERY or n <= NATIVE_MAX_CONTEXT)
    assert plan.ctx.numel() == native_rows
    assert len(plan.sdpa) == sum(q > NATIVE_MAX_QUERY and n > NATIVE_MAX_CONTEXT for n, q in seqs)

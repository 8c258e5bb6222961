"""The Triton attention backend gives the torch backend's logits on a tiny random Llama, through
fresh prompts, a chunk over a cached prefix, a mixed batch and decode-only steps."""
from __future__ import annotations

import random

import pytest
import torch

from shared.worker.attention.metadata import AttentionMetadata
from shared.worker.attention.torch_backend import TorchAttention
from shared.worker.model_loader import allocate_kv_caches
from shared.worker.models import LlamaForCausalLM
from tests.kernels.helpers import tiny_model

pytest.importorskip("triton")

BLOCK_SIZE = 4
# Each step: (sequence, number of new tokens). Sequence 1 arrives as two prompt chunks.
STEPS = [[(0, 6)], [(0, 1), (1, 5)], [(0, 1), (1, 4)], [(0, 1), (1, 1)], [(0, 1), (1, 1)]]


def run(model: LlamaForCausalLM, device: torch.device) -> list[torch.Tensor]:
    """All STEPS through fresh caches; returns each step's logits."""
    dtype = model.embed_tokens.weight.dtype
    caches = allocate_kv_caches(model.arch, 12, BLOCK_SIZE, dtype, device)
    rng = random.Random(0)
    tokens = [[rng.randrange(97) for _ in range(12)] for _ in range(2)]
    free = list(range(12))
    rng.shuffle(free)
    tables: list[list[int]] = [free[:4], free[4:8]]
    done = [0, 0]
    out = []
    for step in STEPS:
        ids, pos, slots, q_lens, seq_lens = [], [], [], [], []
        for s, n in step:
            p = list(range(done[s], done[s] + n))
            ids += tokens[s][p[0]:p[-1] + 1]
            pos += p
            slots += [tables[s][i // BLOCK_SIZE] * BLOCK_SIZE + i % BLOCK_SIZE for i in p]
            q_lens.append(n)
            seq_lens.append(done[s] + n)
            done[s] += n
        qsl = [0]
        for n in q_lens:
            qsl.append(qsl[-1] + n)
        meta = AttentionMetadata(
            torch.tensor(slots, device=device), torch.tensor(qsl, dtype=torch.int32, device=device),
            torch.tensor(seq_lens, dtype=torch.int32, device=device),
            torch.tensor([tables[s] for s, _ in step], dtype=torch.int32, device=device),
            BLOCK_SIZE, q_lens, seq_lens)
        with torch.inference_mode():
            hidden = model(torch.tensor(ids, device=device), torch.tensor(pos, device=device), meta, caches)
            out.append(model.compute_logits(hidden))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_backend_matches_torch_logits(dtype: torch.dtype, device: torch.device) -> None:
    from shared.worker.attention.triton_backend import TritonAttention

    model = tiny_model(dtype).to(device)
    expected = run(model, device)
    arch = model.arch
    model.set_attention_backend(TritonAttention(
        arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim, arch.head_dim ** -0.5))
    got = run(model, device)
    model.set_attention_backend(TorchAttention(
        arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim, arch.head_dim ** -0.5))
    # bf16: logits of a few units differ by a few bf16 ulps (different summation orders).
    atol, rtol = (1e-4, 1e-4) if dtype == torch.float32 else (0.2, 0.05)
    for step, (g, e) in enumerate(zip(got, expected)):
        torch.testing.assert_close(g, e, atol=atol, rtol=rtol, msg=lambda m: f"step {step}: {m}")

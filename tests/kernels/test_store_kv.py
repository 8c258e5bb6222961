"""store_kv against its reference: ragged slots, padding slots (-1), strided k/v, edge sizes."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernels.store_kv import store_kv, store_kv_ref  # noqa: E402


def _case(n: int, kvh: int, d: int, block_size: int, dtype: torch.dtype, device: torch.device):
    gen = torch.Generator().manual_seed(n * 31 + kvh)
    num_blocks = 6
    # k and v as views into one fused projection, as the model hands them over (row stride > KVH*D).
    qkv = torch.randn(n, 3 * kvh, d, generator=gen).to(dtype).to(device)
    k, v = qkv[:, kvh:2 * kvh], qkv[:, 2 * kvh:]
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:n]
    if n > 1:
        slots[1] = -1                                # a padding row writes nothing
    caches = [torch.randn(num_blocks, block_size, kvh, d, generator=gen).to(dtype).to(device)
              for _ in range(2)]
    return k, v, caches, slots.to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("kvh,n", [(1, 5), (3, 9), (2, 1), (2, 0)])
def test_store_kv_matches_reference(dtype: torch.dtype, block_size: int, kvh: int, n: int,
                                    device: torch.device) -> None:
    k, v, (kc, vc), slots = _case(n, kvh, 16, block_size, dtype, device)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    store_kv_ref(k, v, kc_ref, vc_ref, slots)
    store_kv(k, v, kc, vc, slots)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)


def test_store_kv_rejects_bad_input(device: torch.device) -> None:
    k, v, (kc, vc), slots = _case(4, 2, 16, 8, torch.float32, device)
    with pytest.raises(ValueError, match="int64"):
        store_kv(k, v, kc, vc, slots.int())
    with pytest.raises(ValueError, match="do not fit"):
        store_kv(k[:, :1], v[:, :1], kc, vc, slots)
    with pytest.raises(ValueError, match="entries"):
        store_kv(k, v, kc, vc, slots[:2])

"""store_kv: write this step's K and V rows into the paged cache at their slots.

``slot = block_id * block_size + offset``; a negative slot means "no write" (padding rows).
"""
from __future__ import annotations

import torch

from kernels._triton import check_cache_pair, check_ready, check_tensor, jit, next_pow2, tl


def store_kv_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    """k, v [N, KVH, D]; caches [num_blocks, block_size, KVH, D]; slot_mapping [N] int64."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k[keep].to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v[keep].to(v_cache.dtype)


@jit
def _store_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
                     stride_kn, stride_kh, stride_vn, stride_vh,
                     stride_cb, stride_cs, stride_ch, block_size, num_kv_heads,
                     HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    i = tl.program_id(0)
    slot = tl.load(slot_ptr + i)                      # int64: cache offsets can pass 2**31
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    # The slot test is broadcast to a full tile (a scalar bool mask trips the interpreter).
    keep = (tl.zeros([BLOCK_H, BLOCK_D], tl.int64) + slot) >= 0
    mask = (h < num_kv_heads) & (d < HEAD_DIM) & keep
    block = tl.maximum(slot, 0) // block_size
    dst = block * stride_cb + (tl.maximum(slot, 0) % block_size) * stride_cs + h * stride_ch + d
    k = tl.load(k_ptr + i * stride_kn + h * stride_kh + d, mask=mask)
    v = tl.load(v_ptr + i * stride_vn + h * stride_vh + d, mask=mask)
    tl.store(kc_ptr + dst, k.to(kc_ptr.dtype.element_ty), mask=mask)
    tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty), mask=mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """The Triton version of ``store_kv_ref`` (same arguments, writes in place)."""
    check_tensor("k", k, 3)
    check_tensor("v", v, 3)
    check_cache_pair(k_cache, v_cache)
    check_tensor("slot_mapping", slot_mapping, 1, (torch.int64,))
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} differ")
    n, kvh, d = k.shape
    if (kvh, d) != tuple(k_cache.shape[2:]):
        raise ValueError(f"k rows [{kvh}, {d}] do not fit cache rows {tuple(k_cache.shape[2:])}")
    if slot_mapping.shape[0] != n:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries for {n} rows")
    check_ready(k, v, k_cache, v_cache, slot_mapping)
    if n == 0:
        return
    _store_kv_kernel[(n,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.shape[1], kvh,
        HEAD_DIM=d, BLOCK_H=next_pow2(kvh), BLOCK_D=next_pow2(d))

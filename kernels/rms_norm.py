"""RMSNorm with an optional fused residual add, in the arithmetic order of ``layers.RMSNorm``:

    x = x + residual          (in the model dtype; the sum is written back to ``residual``)
    y = weight * (x.float() * rsqrt(mean(x.float() ** 2) + eps)).to(dtype)
"""
from __future__ import annotations

import torch

from kernels._triton import check_ready, check_tensor, jit, next_pow2, tl


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x [M, hidden] -> (normed x, x + residual or None). Does not modify its inputs."""
    if residual is not None:
        x = x + residual
        residual = x
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype), residual


@jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, stride_x, stride_r, stride_o, hidden, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_ptr + row * stride_r + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, 0) / hidden + eps)
    y = (xf * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (y * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The Triton version of ``rms_norm_ref``, except that ``residual`` (when given) is updated in
    place to x + residual and returned, as fused add-norm kernels do."""
    check_tensor("x", x, 2)
    check_tensor("weight", weight, 1)
    m, hidden = x.shape
    if weight.shape[0] != hidden:
        raise ValueError(f"weight has {weight.shape[0]} entries for hidden size {hidden}")
    if residual is not None:
        check_tensor("residual", residual, 2, (x.dtype,))
        if residual.shape != x.shape:
            raise ValueError(f"residual {tuple(residual.shape)} != x {tuple(x.shape)}")
    check_ready(x, weight, *([residual] if residual is not None else []))
    out = torch.empty(m, hidden, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if m == 0:
        return out, residual
    res = residual if residual is not None else x     # unused pointer when HAS_RESIDUAL is off
    _rms_norm_kernel[(m,)](x, res, weight, out, x.stride(0), res.stride(0), out.stride(0), hidden, eps,
                           HAS_RESIDUAL=residual is not None, BLOCK=next_pow2(hidden))
    return out, residual

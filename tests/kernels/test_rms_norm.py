"""RMSNorm (with and without the fused residual add) against its reference and layers.RMSNorm."""
from __future__ import annotations

import pytest
import torch

from kernels.rms_norm import rms_norm_ref
from shared.worker.models.layers import RMSNorm
from tests.kernels.helpers import assert_close

EPS = 1e-5


def _inputs(m: int, hidden: int, dtype: torch.dtype, device: torch.device):
    gen = torch.Generator().manual_seed(m + hidden)
    x = (torch.randn(m, hidden, generator=gen) * 3).to(dtype).to(device)
    res = torch.randn(m, hidden, generator=gen).to(dtype).to(device)
    w = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype).to(device)
    return x, res, w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,hidden", [(5, 64), (3, 100), (1, 48), (0, 64)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(dtype: torch.dtype, m: int, hidden: int, with_residual: bool,
                                    device: torch.device) -> None:
    pytest.importorskip("triton")
    from kernels.rms_norm import rms_norm

    x, res, w = _inputs(m, hidden, dtype, device)
    ref_out, ref_sum = rms_norm_ref(x, w, EPS, res if with_residual else None)
    res_in = res.clone()
    out, summed = rms_norm(x, w, EPS, res_in if with_residual else None)
    assert_close(out, ref_out, dtype)
    if with_residual:
        assert summed is res_in                      # updated in place
        assert_close(res_in, ref_sum, dtype)
    else:
        assert summed is None


def test_reference_matches_model_layer() -> None:
    x, _, w = _inputs(4, 64, torch.bfloat16, torch.device("cpu"))
    layer = RMSNorm(64, EPS)
    layer.weight.data = w
    assert torch.equal(rms_norm_ref(x, w, EPS)[0], layer(x))

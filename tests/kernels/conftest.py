"""Kernel tests run under Triton's interpreter on CPU unless TRITON_INTERPRET is already set
(``TRITON_INTERPRET=0`` on a GPU machine runs them natively on CUDA).

The variable must be set before anything imports triton, hence at the top of this conftest.
"""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


def interpreting() -> bool:
    return os.environ["TRITON_INTERPRET"].lower() in ("1", "true", "on", "yes")


@pytest.fixture(scope="session")
def device() -> torch.device:
    if interpreting():
        return torch.device("cpu")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: TRITON_INTERPRET is off and there is none")
    return torch.device("cuda")

"""The soak benchmark's machinery, run for a few seconds (make soak runs it for 10 minutes)."""
from __future__ import annotations

import pytest

from compare.soak import soak

pytestmark = pytest.mark.slow


def test_a_short_soak_leaves_nothing_behind(default_model_dir: str) -> None:
    result = soak("v0", minutes=0.1, concurrency=8)
    assert result["checks"]["idle"] and result["checks"]["kv_free"]
    assert result["checks"]["request_state_empty"], result["request_state"]
    assert result["requests"].get("status_200", 0) > 0 and result["requests"].get("bad_400", 0) > 0

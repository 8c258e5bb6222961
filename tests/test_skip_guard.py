"""The skip guard (tests/skip_guard.py): a skip for any reason but needing a CUDA GPU fails the
run. Each case runs pytest on a tiny file in its own process with only the guard loaded."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

BAD_SKIP = """
    import pytest

    def test_runs():
        pass

    def test_needs_a_cache():
        pytest.skip("model not in the local cache")
"""
BAD_MODULE_SKIP = """
    import pytest

    pytest.importorskip("twinserve_no_such_module")

    def test_never_collected():
        pass
"""
CUDA_SKIPS = """
    import pytest

    def test_runs():
        pass

    def test_explicit_cuda_skip():
        pytest.skip("needs a CUDA GPU")

    @pytest.mark.cuda
    def test_marked_cuda():
        import torch
        assert torch.cuda.is_available()     # skipped by the guard's marker handling otherwise
"""


def run_pytest(tmp_path: Path, source: str, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_case.py").write_text(textwrap.dedent(source), encoding="utf-8")
    environ = {k: v for k, v in os.environ.items()
               if k not in ("TWINSERVE_ALLOW_SKIPS", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    environ |= {"PYTHONPATH": str(REPO), **env}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "-p", "tests.skip_guard",
         "test_case.py"], cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120,
        check=False)


@pytest.mark.parametrize("source, culprit", [(BAD_SKIP, "test_case.py::test_needs_a_cache"),
                                             (BAD_MODULE_SKIP, "test_case.py")])
def test_other_skip_fails_the_run(tmp_path: Path, source: str, culprit: str) -> None:
    proc = run_pytest(tmp_path, source)
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, proc.stdout + proc.stderr
    assert "skipped without needing a CUDA GPU" in proc.stdout
    assert any(line.startswith(culprit + ":") for line in proc.stdout.splitlines()), proc.stdout


def test_cuda_skips_pass(tmp_path: Path) -> None:
    proc = run_pytest(tmp_path, CUDA_SKIPS)
    assert proc.returncode == pytest.ExitCode.OK, proc.stdout + proc.stderr
    assert "skip guard" not in proc.stdout
    try:
        import torch
        gpu = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a dependency
        gpu = False
    assert ("2 passed, 1 skipped" if gpu else "1 passed, 2 skipped") in proc.stdout, proc.stdout


def test_opt_out_lets_a_local_run_pass(tmp_path: Path) -> None:
    proc = run_pytest(tmp_path, BAD_SKIP, TWINSERVE_ALLOW_SKIPS="1")
    assert proc.returncode == pytest.ExitCode.OK, proc.stdout + proc.stderr
    assert "allowed by TWINSERVE_ALLOW_SKIPS" in proc.stdout

"""Fail the run when a test is skipped for any reason but needing a CUDA GPU.

A skip hides a test that CI believes it ran: a missing model cache, dependency or fixture must
fail loudly instead. The one allowed reason is ``CUDA_SKIP_REASON`` (tests marked ``cuda`` on a
machine without a GPU get it automatically); ``TWINSERVE_ALLOW_SKIPS=1`` turns the guard off
for a local run. Loaded by tests/conftest.py; ``pytest -p tests.skip_guard`` loads it elsewhere.
Imports nothing heavy: torch only when a ``cuda`` test is collected.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from _pytest.terminal import TerminalReporter

CUDA_SKIP_REASON = "needs a CUDA GPU"
_OPT_OUT = "TWINSERVE_ALLOW_SKIPS"
_bad_skips: dict[str, str] = {}     # nodeid -> reason, in the order they were reported


def pytest_configure(config: pytest.Config) -> None:
    if not any(line.split(":")[0].strip() == "cuda" for line in config.getini("markers")):
        config.addinivalue_line("markers", f"cuda: {CUDA_SKIP_REASON} (skipped without one)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cuda_items = [item for item in items if item.get_closest_marker("cuda")]
    if not cuda_items:
        return
    import torch

    if not torch.cuda.is_available():
        for item in cuda_items:
            item.add_marker(pytest.mark.skip(reason=CUDA_SKIP_REASON))


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:      # (path, lineno, "Skipped: why")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _record(report: pytest.TestReport | pytest.CollectReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = _skip_reason(report)
        if CUDA_SKIP_REASON not in reason:
            _bad_skips.setdefault(report.nodeid, reason)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _record(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _record(report)                 # a whole module skipped (importorskip, allow_module_level)


def _enforced() -> bool:
    return os.environ.get(_OPT_OUT, "").lower() not in ("1", "true", "yes", "on")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _bad_skips and _enforced() and exitstatus in (pytest.ExitCode.OK,
                                                     pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    if not _bad_skips:
        return
    verdict = "FAILED" if _enforced() else f"allowed by {_OPT_OUT}"
    terminalreporter.section(f"skip guard: {len(_bad_skips)} test(s) skipped without needing a CUDA GPU")
    for nodeid, reason in _bad_skips.items():
        terminalreporter.line(f"{nodeid}: {reason}")
    terminalreporter.line(f"skip guard {verdict}: only '{CUDA_SKIP_REASON}' skips are allowed; fix "
                          f"the cause (missing model, dependency, fixture) or set {_OPT_OUT}=1 locally")

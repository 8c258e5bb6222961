"""`twinserve trace --engine v0`: the table and the Mermaid diagram of one request, all
in one process (the forward pass in a worker thread)."""
from __future__ import annotations

import re

import pytest

from shared.cli.main import main


def test_trace_cli_table_and_mermaid(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "--engine", "v0", "--max-tokens", "3", "Say hi."]) == 0
    out = capsys.readouterr().out
    table, diagram = out.split("```mermaid")
    rows = [line for line in table.splitlines() if re.match(r"\| \d", line)]
    steps = [int(row.split("|")[1].split("-")[0]) for row in rows]
    assert [s for i, s in enumerate(steps) if s not in steps[:i]] == list(range(1, 14))
    pids = {re.search(r"\((\d+)\)", row.split("|")[4]).group(1) for row in rows}
    assert len(pids) == 1                        # v0: one process
    assert diagram.strip().startswith("sequenceDiagram") and diagram.rstrip().endswith("```")
    assert diagram.count("participant ") >= 2    # the loop thread and a forward worker

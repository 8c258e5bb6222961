"""The lifecycle map: one Step enum, and the README and docs/DESIGN.md tables are its output."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from shared.trace.steps import Step, lifecycle_table
from tests.shared.trace.lifecycle_map import resolve_where

ROOT = Path(__file__).resolve().parents[3]


def test_steps_are_the_thirteen_rows_in_order() -> None:
    assert [s.value for s in Step] == list(range(1, 14))
    assert all(s.label and s.where for s in Step)


@pytest.mark.parametrize("doc", ["README.md", "docs/DESIGN.md"])
def test_docs_embed_the_generated_table(doc: str) -> None:
    text = (ROOT / doc).read_text()
    assert lifecycle_table() in text, f"{doc}: regenerate with python -c " \
        "'from shared.trace.steps import lifecycle_table; print(lifecycle_table())'"


def test_every_file_and_function_on_the_map_exists() -> None:
    for step in Step:
        paths = re.findall(r"`([\w/]+\.py)`(?: \(([^)]*)\))?", step.where)
        assert paths, step
        for path, names in paths:
            assert (ROOT / path).is_file(), (step, path)
            module = path[:-3].replace("/", ".")
            for name in re.findall(r"`([A-Za-z_][\w.]*)`", names or ""):
                if name.endswith(".py"):
                    continue
                assert callable(resolve_where(f"{module}:{name}")), (step, path, name)

"""Checks that tie a live trace to the lifecycle map in ``shared.trace.steps``."""
from __future__ import annotations

import importlib
from typing import Any

from shared.trace.steps import Step


def resolve_where(where: str) -> Any:
    """The function a trace event's ``module:Qualified.name`` names (raises if there is none)."""
    module, qualname = where.split(":", 1)
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def assert_event_on_the_map(event: dict[str, Any]) -> None:
    """The event's code location exists and is the one the map names for its step."""
    if "steps" in (event.get("detail") or {}):
        return      # a decode summary folds several steps; its first event was checked
    fn = resolve_where(event["where"])
    assert callable(fn), event["where"]
    module, qualname = event["where"].split(":", 1)
    cell = Step(event["step"]).where
    assert f"`{module.replace('.', '/')}.py`" in cell, (event["step"], event["where"], cell)
    assert f"`{qualname}" in cell, (event["step"], event["where"], cell)

"""twinserve's shared core: both engines are built from these parts."""
from __future__ import annotations

from typing import TYPE_CHECKING

from shared.messages import SamplingParams

if TYPE_CHECKING:
    from shared.llm import LLM

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):
    # LLM pulls in torch and the model code: import it only when asked for.
    if name == "LLM":
        from shared.llm import LLM

        return LLM
    raise AttributeError(name)

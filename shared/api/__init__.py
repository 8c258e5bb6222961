"""The HTTP layer both engines share: OpenAI-compatible routes over any EngineClient."""
from __future__ import annotations

from shared.api.server import build_app, run_server

__all__ = ["build_app", "run_server"]

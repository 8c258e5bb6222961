"""Engine v0: everything on one asyncio loop in one process, the vLLM-v0 way."""
from __future__ import annotations

from engine_v0.async_engine import AsyncEngine

__all__ = ["AsyncEngine"]

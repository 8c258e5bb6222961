"""Engine v1: the API server and the engine core in separate processes, linked by ZMQ."""
from __future__ import annotations

from engine_v1.client import AsyncLLM
from engine_v1.core_client import CoreProcessClient

__all__ = ["AsyncLLM", "CoreProcessClient"]

"""Per-app state (on ``app.state.twinserve``): no module-level globals in the API layer."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.api.logprobs import TokenText
from shared.api.metrics import ApiMetrics
from shared.config import ServerConfig
from shared.engine_client import EngineClient
from shared.loop_probe import LoopLagProbe

if TYPE_CHECKING:
    from shared.api.fanout import FanOut


@dataclass
class AppState:
    engine: EngineClient
    config: ServerConfig
    metrics: ApiMetrics
    texts: TokenText
    model_name: str
    accepted_models: set[str]
    inflight: set[FanOut] = field(default_factory=set)   # for abort on shutdown
    loop_probe: LoopLagProbe = field(default_factory=LoopLagProbe)
    shutting_down: bool = False

    @classmethod
    def create(cls, engine: EngineClient, config: ServerConfig) -> AppState:
        info = engine.model_info
        name = config.served_model_name or info.name
        return cls(engine=engine, config=config, metrics=ApiMetrics(config.engine),
                   texts=TokenText(engine.tokenizer), model_name=name,
                   accepted_models={name, info.name, info.path})

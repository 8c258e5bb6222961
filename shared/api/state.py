"""Per-app state (on ``app.state.twinserve``): no module-level globals in the API layer."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shared.api.generation_defaults import load_generation_defaults
from shared.api.logprobs import TokenText
from shared.api.loop_probe import LoopLagProbe
from shared.api.metrics import ApiMetrics
from shared.config import ServerConfig
from shared.frontend.engine_client import EngineClient
from shared.trace.store import TraceStore
from shared.trace.tracer import Tracer

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
    traces: TraceStore                 # lifecycle traces (/debug/lifecycle)
    tracer: Tracer                     # records this process's trace events into ``traces``
    # Request field -> the model's default for it (--generation-config), used when omitted.
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    inflight: set[FanOut] = field(default_factory=set)   # for abort on shutdown
    loop_probe: LoopLagProbe = field(default_factory=LoopLagProbe)

    @classmethod
    def create(cls, engine: EngineClient, config: ServerConfig) -> AppState:
        info = engine.model_info
        name = config.served_model_name or info.name
        # Share the engine's store, so its events and ours land in one trace; an engine
        # without one (a test fake) gets a store that only sees the HTTP steps.
        traces = getattr(engine, "traces", None) or TraceStore()
        tracer = getattr(engine, "tracer", None) or Tracer("api-server", sink=traces.add)
        metrics = ApiMetrics(name, info.max_model_len, config.metrics_prefix)
        add_step_listener = getattr(engine, "add_step_listener", None)   # a test fake has none
        if add_step_listener is not None:
            add_step_listener(metrics.on_step)
        return cls(engine=engine, config=config, metrics=metrics,
                   texts=TokenText(engine.tokenizer), model_name=name,
                   accepted_models={name, info.name, info.path}, traces=traces, tracer=tracer,
                   generation_defaults=load_generation_defaults(config.generation_config, info.path))

"""Starlette app and uvicorn runner shared by both engines (lifecycle steps 1 and 13)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from importlib.metadata import PackageNotFoundError, version

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from shared.api.errors import APIError, to_api_error
from shared.api.http_limits import HeaderLimitMiddleware, guarded_h11
from shared.api.httputil import AuthMiddleware, read_body
from shared.api.openapi import openapi_schema
from shared.api.protocol import DetokenizeRequest, TokenizeRequest, decode_body, to_builtins
from shared.api.requests import check_model, check_token_ids, render_chat
from shared.api.serving import json_response
from shared.api.serving_chat import ChatServing
from shared.api.serving_completion import CompletionServing
from shared.api.serving_responses import ResponsesServing
from shared.api.state import AppState
from shared.api.watchdog import EngineWatchdog
from shared.config import ServerConfig
from shared.errors import ParamError
from shared.frontend.engine_client import EngineClient

Handler = Callable[[Request], Awaitable[Response]]
_SHUTDOWN_GRACE_S = 3.0     # in-flight HTTP requests get this long after a signal
_ENGINE_SHUTDOWN_S = 10.0


def _state(request: Request) -> AppState:
    return request.app.state.twinserve


def _guarded(handler: Handler) -> Handler:
    """Every failure becomes an OpenAI error object; the server keeps serving."""
    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as exc:
            return to_api_error(exc).response()
    return route


async def health(request: Request) -> Response:
    await _state(request).engine.check_health()   # EngineDeadError -> 503
    return json_response({"status": "ok"})


async def version_info(request: Request) -> Response:
    try:
        ver = version("twinserve")
    except PackageNotFoundError:
        ver = "unknown"
    return json_response({"version": ver, "engine": _state(request).config.engine})


async def models(request: Request) -> Response:
    st = _state(request)
    info = st.engine.model_info
    card = {"id": st.model_name, "object": "model", "created": 0, "owned_by": "twinserve",
            "root": info.path, "parent": None, "max_model_len": info.max_model_len}
    return json_response({"object": "list", "data": [card]})


async def tokenize(request: Request) -> Response:
    st = _state(request)
    req = decode_body(await read_body(request, st.config.max_body_bytes, st.config.timeout_body), TokenizeRequest)
    check_model(req.model, st.accepted_models)
    tok = st.engine.tokenizer
    if isinstance(req.prompt, str) == isinstance(req.messages, list):
        raise ParamError("give exactly one of prompt or messages", param="prompt")
    if isinstance(req.messages, list):   # non-empty: the Struct's bound checked it
        ids = render_chat(tok, to_builtins(req.messages), req.add_generation_prompt is not False)
    else:
        ids = tok.encode(str(req.prompt), add_special_tokens=req.add_special_tokens is not False)
    return json_response({"tokens": ids, "count": len(ids),
                          "max_model_len": st.engine.model_info.max_model_len})


async def detokenize(request: Request) -> Response:
    st = _state(request)
    req = decode_body(await read_body(request, st.config.max_body_bytes, st.config.timeout_body), DetokenizeRequest)
    check_model(req.model, st.accepted_models)
    check_token_ids(req.tokens, st.engine.model_info.vocab_size, "tokens")
    return json_response({"prompt": st.engine.tokenizer.decode(req.tokens)})


async def metrics(request: Request) -> Response:
    st = _state(request)
    return Response(await st.metrics.render(st.engine), media_type="text/plain; version=0.0.4; charset=utf-8")


async def debug_stats(request: Request) -> Response:
    st = _state(request)
    return json_response({**await st.engine.get_stats(), "loop_lag": st.loop_probe.snapshot()})


async def lifecycle(request: Request) -> Response:
    """One request's events, ``t_ms`` since HTTP received; 404 unless it was traced."""
    st = _state(request)
    request_id = request.path_params["request_id"]
    trace = st.traces.get(request_id)
    if trace is None:
        raise APIError(404, f"no lifecycle trace for {request_id!r}: send the header "
                            f"'X-Twinserve-Trace: 1' or start the server with --trace",
                       param="request_id", code="trace_not_found")
    return json_response(trace.to_json(st.config.engine))


async def lifecycle_all(request: Request) -> Response:
    """Every finished trace still in the ring buffer, oldest first."""
    st = _state(request)
    return json_response({"engine": st.config.engine,
                          "traces": [t.to_json(st.config.engine) for t in st.traces.finished()]})


async def openapi(request: Request) -> Response:
    st = _state(request)
    return json_response(openapi_schema(st.config, st.engine.model_info, st.model_name))


async def _http_error(request: Request, exc: Exception) -> Response:
    """Unknown paths and wrong methods, still as OpenAI error objects."""
    assert isinstance(exc, HTTPException)
    response = APIError(exc.status_code, str(exc.detail)).response()
    response.headers.update(exc.headers or {})   # e.g. Allow on a 405
    return response


def _names(text: str) -> list[str]:
    """A CORS flag: 'a,b' or vLLM's JSON list '["a", "b"]'."""
    if text.strip().startswith("["):
        return [str(v) for v in json.loads(text)]
    return [v.strip() for v in text.split(",") if v.strip()]


def build_app(engine: EngineClient, config: ServerConfig) -> Starlette:
    state = AppState.create(engine, config)
    g = _guarded
    responses = ResponsesServing(state)
    routes = [
        Route("/v1/responses", g(responses), methods=["POST"]),
        Route("/v1/responses/{response_id}", g(responses.get), methods=["GET"]),
        Route("/v1/chat/completions", g(ChatServing(state)), methods=["POST"]),
        Route("/v1/completions", g(CompletionServing(state)), methods=["POST"]),
        Route("/v1/models", g(models), methods=["GET"]),
        Route("/health", g(health), methods=["GET"]),
        Route("/version", g(version_info), methods=["GET"]),
        Route("/tokenize", g(tokenize), methods=["POST"]),
        Route("/detokenize", g(detokenize), methods=["POST"]),
        Route("/metrics", g(metrics), methods=["GET"]),
        Route("/openapi.json", g(openapi), methods=["GET"]),
    ]
    if config.debug_enabled:
        routes += [Route("/debug/stats", g(debug_stats), methods=["GET"]),
                   Route("/debug/lifecycle", g(lifecycle_all), methods=["GET"]),
                   Route("/debug/lifecycle/{request_id}", g(lifecycle), methods=["GET"])]
    middleware = [Middleware(HeaderLimitMiddleware, max_bytes=config.max_header_bytes),
                  Middleware(AuthMiddleware, api_key=config.api_key)]
    if config.allowed_origins:      # outermost: a browser's preflight carries no API key
        middleware.insert(0, Middleware(
            CORSMiddleware, allow_origins=_names(config.allowed_origins),
            allow_methods=_names(config.allowed_methods), allow_headers=_names(config.allowed_headers),
            allow_credentials=config.allow_credentials))
    app = Starlette(routes=routes, middleware=middleware,
                    exception_handlers={HTTPException: _http_error})
    app.state.twinserve = state
    return app


class _Server(uvicorn.Server):
    """uvicorn's server with our own signal handling: abort in-flight work, exit cleanly.

    uvicorn re-raises a caught SIGTERM after ``serve()`` returns, which would kill the
    process with -15; we handle the signals ourselves so the caller can return 0.
    """

    def __init__(self, config: uvicorn.Config, state: AppState) -> None:
        super().__init__(config)
        self.twinserve = state

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        sigs = (signal.SIGINT, signal.SIGTERM)
        for sig in sigs:
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            yield
        finally:
            for sig in sigs:
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: int) -> None:
        self.handle_exit(sig, None)    # stop accepting; sse-starlette also ends open streams
        for fan in list(self.twinserve.inflight):
            fan.fail(APIError(503, "the server is shutting down"))

    async def startup(self, sockets: list | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            print(f"twinserve: serving on http://{host}:{port}", file=sys.stderr, flush=True)
            self.twinserve.loop_probe.start()


async def run_server(engine: EngineClient, config: ServerConfig) -> int:
    """Serve until SIGINT/SIGTERM (exit code 0), or until the engine died (1: see watchdog.py);
    then abort in-flight requests and shut the engine down."""
    app = build_app(engine, config)
    uv_config = uvicorn.Config(app, host=config.host, port=config.port, lifespan="off",
                               log_level="warning", access_log=False,
                               timeout_graceful_shutdown=_SHUTDOWN_GRACE_S,
                               http=guarded_h11(config.timeout_header),
                               timeout_keep_alive=config.timeout_keep_alive,  # type: ignore[arg-type]
                               h11_max_incomplete_event_size=config.max_header_bytes,
                               limit_concurrency=config.limit_concurrency)
    server = _Server(uv_config, app.state.twinserve)
    watchdog = EngineWatchdog(engine, config.engine_step_timeout, config.keep_alive_on_engine_death,
                              on_exit=lambda: server.handle_exit(signal.SIGTERM, None))
    watchdog.start()
    try:
        await server.serve()
    finally:
        await watchdog.stop()
        await app.state.twinserve.loop_probe.stop()
        for fan in list(app.state.twinserve.inflight):
            fan.close()
        try:
            await asyncio.wait_for(engine.shutdown(), _ENGINE_SHUTDOWN_S)
        except Exception as exc:  # shutting down anyway; say why it was not clean
            print(f"twinserve: engine shutdown failed: {exc!r}", file=sys.stderr, flush=True)
    if watchdog.exit_requested:
        print("twinserve: exiting after engine death", file=sys.stderr, flush=True)
        return 1
    return 0

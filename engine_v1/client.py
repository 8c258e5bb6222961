"""v1's API-process side: an EngineClient that talks to its core process(es) over ZMQ.

Requests go out on a PUSH socket (lifecycle step 4); an output-handler task per core receives
EngineCoreOutputs, runs the shared OutputProcessor and feeds each request's stream.

Data parallel (``--data-parallel-size N``): N cores, each with its own scheduler, KV cache and
model copy, and each with its own pair of sockets. Separate output sockets (rather than one
PULL all cores push to) keep each core's link and process one unit: the handler that reads a
core's socket is the one that notices that core's process gone, and start-up, READY and
shutdown stay what they are for one core. ``DPRouter`` picks a core per request; an abort
goes to the core that owns the request. One dead core makes the whole engine dead (every
request fails, /health is 503, the death policy of shared/api/watchdog.py applies), because a
server missing a core would quietly serve at a fraction of its capacity.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import zmq
import zmq.asyncio

from engine_v1 import wire
from engine_v1.dp_router import DPRouter
from engine_v1.launcher import CoreLauncher, start_cores
from shared.config import EngineConfig
from shared.errors import EngineDeadError, ParamError
from shared.frontend.base import EngineFrontend
from shared.frontend.tasks import cancel_and_wait
from shared.frontend.tokenizer import Tokenizer
from shared.messages import EngineCoreOutputs, EngineCoreRequest
from shared.trace.steps import Step
from shared.worker.model_fetch import resolve_model

log = logging.getLogger("twinserve.v1")
_POLL_MS = 250  # how often an output handler checks that its core is alive


class AsyncLLM(EngineFrontend):
    """EngineClient whose EngineCore(s) run in separate processes."""

    def __init__(self, config: EngineConfig, max_waiting_requests: int = 256,
                 ready_timeout_s: float = 300.0) -> None:
        path = resolve_model(config.model.model)
        n = config.parallel.data_parallel_size
        # Spawned first, so the tokenizer loads while the cores load the model.
        self.launchers, wait_ready = start_cores(config, path, n)
        tokenizer = Tokenizer(path)
        readies = wait_ready(ready_timeout_s)
        super().__init__(tokenizer, readies[0].model_info, max_waiting_requests, num_engines=n)
        self.core_pids = [r.pid for r in readies]
        self.core_pid = self.core_pids[0]  # shown in /debug/stats for per-process CPU accounting
        self.codec = wire.WireCodec()
        self.router = DPRouter(n, readies[0].model_info.block_size,
                               affinity=config.parallel.data_parallel_prefix_affinity)
        self._out_socks = [zmq.asyncio.Socket.from_socket(lc.out_sock) for lc in self.launchers]
        self._handlers: list[asyncio.Task[None]] = []

    @property
    def launcher(self) -> CoreLauncher:
        """Core 0's launcher (the only one without data parallel)."""
        return self.launchers[0]

    def _submit(self, request: EngineCoreRequest) -> None:
        self._ensure_handlers()
        engine = self.router.route(request.request_id, request.prompt_token_ids,
                                   request.prefill_leader)
        try:
            self._send(engine, wire.ADD, request)
        except EngineDeadError:
            self.router.finished(request.request_id)
            raise
        if request.trace:
            self.tracer.event(request.request_id, Step.SUBMITTED, "handed to the engine",
                              {"link": "ZMQ PUSH over IPC, msgpack", "engine": engine},
                              where=self._submit)

    def _abort_in_core(self, request_ids: list[str]) -> None:
        by_engine: dict[int, list[str]] = {}
        for rid in request_ids:
            engine = self.router.finished(rid)
            if engine is not None:    # None: it finished already, nothing to abort
                by_engine.setdefault(engine, []).append(rid)
        for engine, rids in by_engine.items():
            self._send(engine, wire.ABORT, rids)

    def _send(self, engine: int, tag: bytes, payload: object) -> None:
        try:
            self.launchers[engine].send(self.codec.encode(tag, payload))
        except zmq.ZMQError as e:
            self.fail_all(e)
            raise EngineDeadError(f"engine core {engine} unreachable: {e}") from e

    def _ensure_handlers(self) -> None:
        if not self._handlers:
            loop = asyncio.get_running_loop()
            self._handlers = [loop.create_task(self._output_handler(i), name=f"v1-output-handler-{i}")
                              for i in range(len(self.launchers))]

    async def get_stats(self) -> dict[str, Any]:
        stats = await super().get_stats()
        for core, lc, pid in zip(stats["engines"], self.launchers, self.core_pids):
            core |= {"pid": pid, "alive": lc.is_alive(), "in_flight": self.router.loads[lc.engine_index].in_flight}
        # Extra cores are "core1", "core2", ...: the harness sums every core* pid's CPU time.
        stats["pids"] |= {f"core{i}": pid for i, pid in enumerate(self.core_pids) if i}
        stats["request_state"]["api_routes"] = self.router.num_tracked
        stats["data_parallel"] = {"size": len(self.launchers), "affinity_routed": self.router.affinity_routed}
        return {**stats, "ipc_dir": str(self.launcher.ipc_dir),
                "ipc_dirs": [str(lc.ipc_dir) for lc in self.launchers]}

    async def check_health(self) -> None:
        self._ensure_handlers()
        if self._dead is None:
            self._check_cores()
        self._check_alive()

    def _check_cores(self) -> None:
        for lc, pid in zip(self.launchers, self.core_pids):
            if not lc.is_alive():
                self.fail_all(RuntimeError(f"engine core {lc.engine_index} (process {pid}) exited"))
                return

    async def _output_handler(self, engine: int) -> None:
        sock = self._out_socks[engine]
        try:
            while self._dead is None:
                if not await sock.poll(_POLL_MS):
                    if not self.launchers[engine].is_alive():
                        self._check_cores()
                    continue
                frames = await sock.recv_multipart()
                self._dispatch(engine, *self.codec.decode(frames))
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # any escape means a dead engine
            log.exception("output handler of engine core %d died", engine)
            self.fail_all(e)

    def _dispatch(self, engine: int, tag: bytes, payload: object) -> None:
        if tag == wire.OUTPUTS:
            assert isinstance(payload, EngineCoreOutputs)
            self._route_outputs(payload)
            self.process_engine_outputs(payload)
        elif tag == wire.REJECT:
            assert isinstance(payload, wire.CoreReject)
            self.router.finished(payload.request_id)
            self.fail_request(payload.request_id, ParamError(payload.message, payload.param))
        elif tag == wire.FAILED:
            assert isinstance(payload, wire.CoreFailure)
            log.error("engine core %d failed: %s", engine, payload.message)
            self.fail_all(RuntimeError(f"engine core {engine}: {payload.message}"))

    def _route_outputs(self, outputs: EngineCoreOutputs) -> None:
        """Tell the router what ended and what the core's queues hold now."""
        for out in outputs.outputs:
            if out.finish_reason is not None or out.error is not None:
                self.router.finished(out.request_id)
        if outputs.stats is not None:
            s = outputs.stats
            self.router.update_stats(outputs.engine_index, s.num_running, s.num_waiting, s.kv_cache_usage)

    async def shutdown(self) -> None:
        for task in self._handlers:
            await cancel_and_wait(task)
        if self._dead is None:
            self.fail_all(RuntimeError("server shutting down"))
        # In parallel: each stop may wait seconds for its core to exit.
        await asyncio.gather(*(asyncio.to_thread(lc.stop) for lc in self.launchers))

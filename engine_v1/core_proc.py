"""The engine-core process: an EngineCore wrapped with sockets, threads and a busy loop.

    API process                       core process
    ----------- ADD/ABORT (PUSH) -->  input thread -> input queue
                                      main thread:  run_busy_loop
                                         1. _process_input_queue (blocks when idle)
                                         2. _process_engine_step (schedule, forward, sample, update)
    <-- OUTPUTS (PUSH) -------------  main thread, as the next forward starts
                                      (``_send``: any thread, one at a time)
"""
from __future__ import annotations

import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import zmq

from engine_v1 import wire
from shared.config import EngineConfig
from shared.engine_core import EngineCore
from shared.errors import ParamError
from shared.messages import EngineCoreOutputs
from shared.processes import watch_parent
from shared.trace.steps import Step
from shared.trace.tracer import Tracer


class EngineCoreProc:
    def __init__(self, config: EngineConfig, model_path: Path, input_addr: str, output_addr: str,
                 engine_index: int = 0) -> None:
        self.engine_index = engine_index      # stamped on every output (data parallel)
        self.codec = wire.WireCodec()
        self.input_queue: queue.Queue[tuple[bytes, Any]] = queue.Queue()
        self.ctx = zmq.Context()
        self.out_sock = self.ctx.socket(zmq.PUSH)
        self.out_sock.connect(output_addr)
        self._send_lock = threading.Lock()    # a zmq socket is not thread-safe
        # Connect the input side before the (slow) model load, so the link is up by READY.
        self.in_sock = self.ctx.socket(zmq.PULL)
        self.in_sock.connect(input_addr)
        try:
            self.core = EngineCore(config, model_path, tracer=Tracer("engine-core"))
        except BaseException as e:
            self.fail(f"engine core failed to start: {type(e).__name__}: {e}")
            self.close()  # flush the failure to the API process before exiting
            raise
        threading.Thread(target=_loud(self._input_loop, self), name="core-input", daemon=True).start()
        self._send(wire.CoreReady(self.core.model_info, os.getpid(), engine_index))
        self._running = True
        self._idle_reported = True
        self._pending: EngineCoreOutputs | None = None    # sent when the next forward starts

    # -- threads ------------------------------------------------------------------------------
    def _input_loop(self) -> None:
        """Receive and decode frames off the main thread; zmq releases the GIL while waiting."""
        while True:
            try:
                frames = [f.bytes for f in self.in_sock.recv_multipart(copy=False)]
            except zmq.ContextTerminated:      # close() at shutdown: the expected end
                return
            tag, payload = self.codec.decode(frames)
            if tag == wire.ADD and payload.trace:
                self.core.tracer.event(payload.request_id, Step.SUBMITTED,
                                       "decoded by the core's input thread",
                                       {"bytes": sum(len(f) for f in frames),
                                        "engine": self.engine_index}, where=self._input_loop)
            self.input_queue.put((tag, payload))

    def _send(self, item: Any) -> None:
        """Encode and send one message to the API process. zmq queues it and its I/O thread
        writes it; past the socket's high-water mark (1000 messages) this blocks, so a stalled
        API process holds the core back instead of growing an unbounded queue."""
        if isinstance(item, EngineCoreOutputs):
            item.engine_index = self.engine_index
        frames = self.codec.encode(wire.TAG_OF[type(item)], item)
        with self._send_lock:
            self.out_sock.send_multipart(frames)

    # -- main thread ---------------------------------------------------------------------------
    def run_busy_loop(self) -> None:
        while self._running:
            self._process_input_queue()
            if self._running:
                self._process_engine_step()

    def _process_input_queue(self) -> None:
        if not self.core.has_unfinished_requests():
            self._flush_pending()   # the final tokens, before blocking
        # Idle: block on the queue (no CPU) until a message arrives.
        while self._running and not self.core.has_unfinished_requests():
            self._handle(*self.input_queue.get())
            self._report_idle()
        while self._running and not self.input_queue.empty():
            self._handle(*self.input_queue.get_nowait())
        self._report_idle()

    def _handle(self, tag: bytes, payload: Any) -> None:
        if tag == wire.ADD:
            try:
                self.core.add_request(payload)
            except ParamError as e:
                self._flush_pending()   # keep the outputs in order
                self._send(wire.CoreReject(payload.request_id, str(e), e.param))
        elif tag == wire.ABORT:
            self.core.abort_requests(payload)
        elif tag == wire.SHUTDOWN:
            self._running = False

    def _process_engine_step(self) -> None:
        batch = self.core.begin_step()
        # The last step's outputs are sent only now, after this step's schedule and prepare
        # and before its forward, on this thread: an output thread encoding during the forward
        # took a CPU from one of the two OpenMP threads, and the other waited at a barrier
        # (sending here, four alternating pairs on a 2-core Xeon: W2 +4-7% output tok/s, W1
        # -3 to +5%, W3 +1 to +18%; the Python queue it had is zmq's own send queue now).
        self._flush_pending()
        self._idle_reported = False
        if batch is None:
            outputs = self.core.outputs_without_step()
        else:
            outputs = self.core.finish_step(batch, self.core.run_forward(batch))
        if outputs.outputs or outputs.step is not None or outputs.trace_events:
            self._pending = outputs
        if outputs.step is None:
            self._flush_pending()
            self._wait_for_input(0.001)

    def _flush_pending(self) -> None:
        if self._pending is not None:
            self._send(self._pending)
            self._pending = None

    def _wait_for_input(self, timeout: float) -> None:
        """Nothing could run (blocks full, grammars compiling): wait briefly for a message
        instead of spinning, which would take a core from the grammar compiler."""
        try:
            self._handle(*self.input_queue.get(timeout=timeout))
        except queue.Empty:
            pass

    def _report_idle(self) -> None:
        """Once the core goes idle (e.g. the last request aborted), send fresh stats, so the
        API side's /metrics shows free blocks without waiting for another step."""
        if self._idle_reported or self.core.has_unfinished_requests():
            return
        self._flush_pending()   # first: its older stats must not arrive after these
        stats = self.core.scheduler.get_stats()
        self._send(EngineCoreOutputs(outputs=[], timestamp=time.time(), stats=stats))
        self._idle_reported = True

    def fail(self, message: str) -> None:
        self._send(wire.CoreFailure(message))

    def close(self) -> None:
        if getattr(self, "core", None) is not None:
            self.core.close()
        self.ctx.destroy(linger=1000)   # linger: what is queued still goes out


def _loud(target: Callable[[], None], proc: EngineCoreProc | None = None) -> Callable[[], None]:
    """A core thread that dies takes the core process down (the API process sees it exit and
    fails every request) instead of leaving it alive and deaf."""
    def run() -> None:
        try:
            target()
        except BaseException as e:  # noqa: BLE001 - any escape is fatal, and said so
            traceback.print_exc()
            if proc is not None:    # zmq's I/O thread may still carry the reason
                proc.fail(f"engine core thread {threading.current_thread().name} died: {e!r}")
                time.sleep(0.2)
            os._exit(1)
    return run


def run_engine_core(config_bytes: bytes, model_path: str, input_addr: str, output_addr: str,
                    engine_index: int = 0) -> None:
    """Entry point of the spawned core process."""
    # Ctrl-C reaches the whole process group; the API server decides when the core stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch_parent(os.getppid())
    config = msgspec.msgpack.decode(config_bytes, type=EngineConfig)
    try:
        proc = EngineCoreProc(config, Path(model_path), input_addr, output_addr, engine_index)
    except BaseException as e:
        raise SystemExit(1) from e
    try:
        proc.run_busy_loop()
    except BaseException as e:
        proc.fail(f"engine core died: {type(e).__name__}: {e}")
        proc.close()
        raise SystemExit(1) from e
    proc.close()

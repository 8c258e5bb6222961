"""Starts the engine-core process, waits for its handshake, and stops it cleanly.

Sockets are IPC sockets in a private 0700 directory, removed at shutdown; never TCP.
"""
from __future__ import annotations

import multiprocessing
import shutil
import tempfile
import time
from pathlib import Path

import msgspec
import zmq

from engine_v1 import wire
from shared.config import EngineConfig


def _core_main(config_bytes: bytes, model_path: str, input_addr: str, output_addr: str) -> None:
    """The spawned core's entry: torch and the model code are imported here, in the child,
    so the API process never loads them and the two processes start up in parallel."""
    from engine_v1.core_proc import run_engine_core

    run_engine_core(config_bytes, model_path, input_addr, output_addr)


class CoreStartError(RuntimeError):
    """The core process failed to start or did not report ready in time."""


class CoreLauncher:
    def __init__(self, config: EngineConfig, model_path: Path) -> None:
        self.config = config
        self.model_path = model_path
        self.ipc_dir = Path(tempfile.mkdtemp(prefix="twinserve-"))  # mkdtemp makes it 0700
        self.ctx = zmq.Context()
        self.in_sock = self.ctx.socket(zmq.PUSH)
        self.in_sock.set(zmq.LINGER, 0)
        self.in_sock.set(zmq.SNDHWM, 0)  # never drop or block on a burst of requests
        self.in_sock.bind(f"ipc://{self.ipc_dir}/input")
        self.output_addr = f"ipc://{self.ipc_dir}/output"
        # Bound here; the handshake reads it blocking, then the client wraps it for asyncio.
        self.out_sock = self.ctx.socket(zmq.PULL)
        self.out_sock.set(zmq.LINGER, 0)
        self.out_sock.bind(self.output_addr)
        self.process: multiprocessing.process.BaseProcess | None = None

    def spawn(self) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.process = spawn.Process(
            target=_core_main, name="twinserve-engine-core", daemon=True,
            args=(msgspec.msgpack.encode(self.config), str(self.model_path),
                  f"ipc://{self.ipc_dir}/input", self.output_addr),
        )
        self.process.start()

    def wait_ready(self, timeout_s: float) -> wire.CoreReady:
        """Block until the core says READY; on failure stop it and raise CoreStartError."""
        try:
            return self._await_ready(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _await_ready(self, timeout_s: float) -> wire.CoreReady:
        codec = wire.WireCodec()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.out_sock.poll(200):
                tag, payload = codec.decode(self.out_sock.recv_multipart())
                if tag == wire.READY:
                    return payload
                if tag == wire.FAILED:
                    raise CoreStartError(payload.message)
            elif not self.is_alive():
                raise CoreStartError(f"engine core process exited with code {self.process.exitcode}")
        raise CoreStartError(f"engine core did not report ready within {timeout_s:.0f} s")

    def send(self, frames: list[bytes], timeout_ms: int = 2000) -> None:
        """Send to the core; raises zmq.Again if it cannot take a message within the bound
        (no connected peer: the core is gone or, right after start-up, not linked yet)."""
        if not self.in_sock.poll(timeout_ms, zmq.POLLOUT):
            raise zmq.Again()
        self.in_sock.send_multipart(frames, flags=zmq.NOBLOCK)

    def is_alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the core to stop, then terminate/kill it if needed; remove the socket dir."""
        if self.process is not None and self.process.is_alive():
            try:
                self.in_sock.send_multipart(wire.WireCodec().encode(wire.SHUTDOWN), flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            self.process.join(timeout_s)
            if self.process.is_alive():
                self.process.terminate()
                self.process.join(2)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(2)
        self.ctx.destroy(linger=0)
        shutil.rmtree(self.ipc_dir, ignore_errors=True)

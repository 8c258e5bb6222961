"""Starts the engine-core process, waits for its handshake, and stops it cleanly.

Sockets are IPC sockets in a private 0700 directory, removed at shutdown; never TCP.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import zmq

from engine_v1 import wire
from shared.config import EngineConfig
from shared.processes import cpu_share


def _core_main(config_bytes: bytes, model_path: str, input_addr: str, output_addr: str,
               engine_index: int) -> None:
    """The spawned core's entry: torch and the model code are imported here, in the child,
    so the API process never loads them and the two processes start up in parallel."""
    from engine_v1.core_proc import run_engine_core

    run_engine_core(config_bytes, model_path, input_addr, output_addr, engine_index)


class CoreStartError(RuntimeError):
    """The core process failed to start or did not report ready in time."""


class CoreLauncher:
    """One engine-core process and its two sockets (data parallel: one launcher per core)."""

    def __init__(self, config: EngineConfig, model_path: Path, engine_index: int = 0) -> None:
        self.config = config
        self.model_path = model_path
        self.engine_index = engine_index
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
            target=_core_main, name=f"twinserve-engine-core-{self.engine_index}", daemon=True,
            args=(msgspec.msgpack.encode(self.config), str(self.model_path),
                  f"ipc://{self.ipc_dir}/input", self.output_addr, self.engine_index),
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
                raise CoreStartError(f"engine core {self.engine_index} process exited with code "
                                     f"{self.process.exitcode}")
        raise CoreStartError(f"engine core {self.engine_index} did not report ready within "
                             f"{timeout_s:.0f} s")

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


def core_config(config: EngineConfig, num_cores: int) -> EngineConfig:
    """Each core's config: with data parallel and no --num-threads, the machine's CPUs are split
    among the cores (at least one each), so N cores x torch's default never oversubscribe."""
    if num_cores == 1 or config.model.num_threads:
        return config
    threads = cpu_share(num_cores)
    return dataclasses.replace(config, model=dataclasses.replace(config.model, num_threads=threads))


def start_cores(config: EngineConfig, model_path: Path, num_cores: int
                ) -> tuple[list[CoreLauncher], Callable[[float], list[wire.CoreReady]]]:
    """Spawn ``num_cores`` cores at once (they load in parallel); the returned function waits
    for every READY and, if any core fails, stops them all before raising."""
    cfg = core_config(config, num_cores)
    launchers = [CoreLauncher(cfg, model_path, i) for i in range(num_cores)]
    try:
        for lc in launchers:
            lc.spawn()
    except BaseException:
        stop_all(launchers)
        raise

    def wait_ready(timeout_s: float) -> list[wire.CoreReady]:
        deadline = time.monotonic() + timeout_s
        try:
            return [lc.wait_ready(max(1.0, deadline - time.monotonic())) for lc in launchers]
        except BaseException:
            stop_all(launchers)
            raise
    return launchers, wait_ready


def stop_all(launchers: list[CoreLauncher]) -> None:
    for lc in launchers:
        lc.stop()

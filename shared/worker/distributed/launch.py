"""Rank 0's side of a tensor-parallel start: host the rendezvous, start this node's workers,
and wait for every rank at each start-up stage, failing fast with the rank's own error.

A worker is ``python -m shared.worker.distributed.worker`` with torchrun's variables set: the
ones on this node are started here; on other nodes they are started by hand (or any launcher)
with the same MASTER_ADDR/MASTER_PORT. Each worker reads the engine config rank 0 resolved
from the store (so dtype and cache shape agree) and reports ``joined/<r>``, then ``loaded/<r>``,
or ``error/<r>`` with the exception.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import torch
import torch.distributed as dist

from shared.config import EngineConfig
from shared.processes import cpu_share
from shared.worker.distributed.group import LOOPBACK, Rendezvous, TensorParallelGroup, bind_master, open_store
from shared.worker.distributed.sharding import check_divides
from shared.worker.models.arch_config import ArchConfig

logger = logging.getLogger(__name__)

CONFIG_KEY = "config"
WORKER_MODULE = "shared.worker.distributed.worker"
START_TIMEOUT_S = 600.0     # each start-up stage; a rank that fails or exits is reported at once
# A collective waits this long: an idle server's workers sit in the step broadcast for hours.
STEP_TIMEOUT_S = 365 * 24 * 3600.0


def start_tensor_parallel(config: EngineConfig, model_path: Path, dtype: torch.dtype,
                          device: torch.device) -> tuple[WorkerLauncher, TensorParallelGroup]:
    """Rank 0: start the workers, wait for them to join, form the group."""
    if config.model.quantization not in ("none", "auto"):
        raise ValueError(f"--quantization {config.model.quantization} is not supported with "
                         "tensor parallelism (the shards run float weights: use none or auto)")
    check_divides(ArchConfig.from_folder(model_path), config.parallel.tensor_parallel_size)
    launcher = WorkerLauncher(config, model_path, str(dtype).removeprefix("torch."))
    if not config.model.num_threads:
        torch.set_num_threads(launcher.threads)     # rank 0 takes its share, as each worker
    try:
        launcher.wait_for("joined")
        return launcher, TensorParallelGroup(launcher.rendezvous, launcher.store, device,
                                             STEP_TIMEOUT_S, uses_shared_memory(config, device),
                                             launcher.raise_if_exited)
    except BaseException:
        launcher.stop(timeout_s=0)
        raise


def uses_shared_memory(config: EngineConfig, device: torch.device) -> bool:
    """Shared-memory collectives: on an x86-64 CPU (its stores stay in order, which the flags
    rely on), with every rank on this node."""
    par = config.parallel
    return (par.tensor_parallel_shared_memory and device.type == "cpu"
            and platform.machine().lower() in ("x86_64", "amd64")
            and par.tensor_parallel_local_size in (0, par.tensor_parallel_size))


def wait_loaded(tp: TensorParallelGroup, launcher: WorkerLauncher | None) -> None:
    """After this rank's load: rank 0 waits for every rank's, the others report theirs."""
    if launcher is not None:
        launcher.wait_for("loaded")
    else:
        report(tp.store, "loaded", tp.rank)


class WorkerLauncher:
    """The rendezvous store rank 0 hosts and the worker processes it started."""

    def __init__(self, config: EngineConfig, model_path: Path, dtype: str,
                 timeout_s: float = START_TIMEOUT_S) -> None:
        par = config.parallel
        addr = os.environ.get("MASTER_ADDR", LOOPBACK)
        listener = bind_master(addr, int(os.environ.get("MASTER_PORT", "0")))
        self.rendezvous = Rendezvous(0, par.tensor_parallel_size, addr, listener.getsockname()[1])
        self.store = open_store(self.rendezvous, listener, timeout_s)
        self.timeout_s = timeout_s
        # What every rank must agree on, resolved once here: the dtype and the float weights.
        worker_config = dataclasses.replace(config, model=dataclasses.replace(
            config.model, model=str(model_path), dtype=dtype, quantization="none"))
        self.store.set(CONFIG_KEY, msgspec.msgpack.encode(worker_config))
        local = par.tensor_parallel_local_size or par.tensor_parallel_size
        # Split the cores so the local ranks never oversubscribe them.
        self.threads = config.model.num_threads or cpu_share(local)
        self.procs = {r: self._spawn(r, self.threads) for r in range(1, local)}
        logger.info("tensor parallel: %d ranks, rendezvous on %s:%d, %d started here "
                    "(%d torch threads each)", par.tensor_parallel_size, addr,
                    self.rendezvous.master_port, local, self.threads)

    def _spawn(self, rank: int, threads: int) -> subprocess.Popen:
        env = os.environ | self.rendezvous.env(rank) | {"OMP_NUM_THREADS": str(threads)}
        cmd = [sys.executable, "-m", WORKER_MODULE, "--parent-pid", str(os.getpid()),
               "--num-threads", str(threads)]
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)

    def wait_for(self, stage: str) -> None:
        """Block until every other rank reported ``stage``; raise naming the first that failed,
        exited or timed out."""
        pending = set(range(1, self.rendezvous.world_size))
        deadline = time.monotonic() + self.timeout_s
        while pending:
            for rank in sorted(pending):
                self._raise_if_failed(rank, stage)
                if self.store.check([f"{stage}/{rank}"]):
                    pending.discard(rank)
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"tensor-parallel ranks {sorted(pending)} did not report "
                                   f"{stage!r} within {self.timeout_s:.0f} s")
            time.sleep(0.02)

    def broadcast(self, tp: TensorParallelGroup, payload: bytes) -> None:
        """One step's inputs to every rank; a rank gone is named, not gloo's socket."""
        try:
            tp.broadcast_bytes(payload)
        except RuntimeError:
            self.raise_if_exited()
            raise

    def broadcast_stop(self, tp: TensorParallelGroup) -> None:
        """Tell every rank to leave, wait for this node's workers, close the group."""
        try:
            tp.broadcast_bytes(None)
        except RuntimeError as e:      # a rank already gone: nothing to tell it
            logger.warning("tensor-parallel stop broadcast failed: %s", e)
        self.stop()
        tp.close()

    def raise_if_exited(self) -> None:
        """Raise if a worker this process started has exited (a collective would wait forever)."""
        for rank, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"tensor-parallel rank {rank} exited with code {proc.returncode}")

    def _raise_if_failed(self, rank: int, stage: str) -> None:
        proc = self.procs.get(rank)
        exited = proc is not None and proc.poll() is not None
        if self.store.check([f"error/{rank}"]) or exited:
            error = (self.store.get(f"error/{rank}").decode()
                     if self.store.check([f"error/{rank}"]) else "no error reported")
            code = f", exit code {proc.returncode}" if exited and proc is not None else ""
            raise RuntimeError(f"tensor-parallel rank {rank} failed before {stage!r}{code}: {error}")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Wait for the workers to leave (after the stop broadcast), killing any that linger."""
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def report(store: dist.Store, stage: str, rank: int, error: BaseException | None = None) -> None:
    """A worker's progress (or failure) for rank 0's ``wait_for``."""
    if error is None:
        store.set(f"{stage}/{rank}", b"1")
    else:
        store.set(f"error/{rank}", f"{type(error).__name__}: {error}".encode())

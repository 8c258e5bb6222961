"""One rank's tensor-parallel group: env:// rendezvous, the model's collectives, byte broadcast.

The rendezvous reads torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), as
``init_method="env://"`` does, but rank 0 hosts the TCPStore on a socket it bound itself: torch's
own store listens on every interface, and on one node nothing should be reachable from outside
127.0.0.1. Step inputs travel as msgspec bytes in a uint8 tensor, never as pickles.
"""
from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from shared.worker.distributed.shm_comm import SharedMemoryComm, file_bytes

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Rendezvous:
    """Where and who: torchrun's environment variables as one value."""

    rank: int
    world_size: int
    master_addr: str = LOOPBACK
    master_port: int = 0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Rendezvous:
        env = dict(os.environ) if env is None else env
        return cls(int(env["RANK"]), int(env["WORLD_SIZE"]), env.get("MASTER_ADDR", LOOPBACK),
                   int(env.get("MASTER_PORT", "0")))

    def env(self, rank: int) -> dict[str, str]:
        """The variables a process of ``rank`` needs (LOCAL_RANK as torchrun sets it)."""
        return {"RANK": str(rank), "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(rank),
                "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port)}

    @property
    def is_loopback(self) -> bool:
        return self.master_addr in (LOOPBACK, "localhost")


def bind_master(addr: str, port: int) -> socket.socket:
    """Rank 0's listening socket, bound to ``addr`` only (port 0: any free port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((socket.gethostbyname(addr), port))
    sock.listen(128)
    return sock


def open_store(rdv: Rendezvous, listener: socket.socket | None, timeout_s: float) -> dist.TCPStore:
    """The rendezvous store: rank 0 serves it on ``listener`` (the store takes the socket over),
    every other rank connects to MASTER_ADDR:MASTER_PORT."""
    timeout = timedelta(seconds=timeout_s)
    if rdv.rank == 0:
        if listener is None:
            raise ValueError("rank 0 needs its bound listening socket")
        return dist.TCPStore(rdv.master_addr, rdv.master_port, rdv.world_size, True, timeout,
                             wait_for_workers=False, master_listen_fd=listener.detach())
    return dist.TCPStore(rdv.master_addr, rdv.master_port, rdv.world_size, False, timeout)


class TensorParallelGroup:
    """The collectives the sharded model and the runner call, over one process group.

    Gloo on CPU; NCCL on CUDA, with a gloo side group for the byte broadcasts. With
    ``shared_memory`` (every rank on this CPU node) all-reduces and all-gathers that fit a slot
    go through ``SharedMemoryComm``; ``check_peers`` raises when a rank is gone.
    """

    def __init__(self, rdv: Rendezvous, store: dist.Store, device: torch.device,
                 timeout_s: float, shared_memory: bool = False,
                 check_peers: Callable[[], None] | None = None) -> None:
        if rdv.is_loopback:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")   # gloo would pick the hostname's NIC
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=store, rank=rdv.rank, world_size=rdv.world_size,
                                timeout=timedelta(seconds=timeout_s))
        self.rank, self.size, self.device, self.store = rdv.rank, rdv.world_size, device, store
        self.cpu_group = dist.new_group(backend="gloo") if backend == "nccl" else None
        self.shm = self._map_shared_memory(check_peers) if shared_memory else None

    def _map_shared_memory(self, check_peers: Callable[[], None] | None) -> SharedMemoryComm:
        """Rank 0 makes the file and names it in the store; once every rank mapped it, it is
        unlinked, so nothing is left behind however the ranks end."""
        if self.rank == 0:
            folder = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
            fd, name = tempfile.mkstemp(prefix="twinserve-tp-", dir=folder)
            os.ftruncate(fd, file_bytes(self.size))
            os.close(fd)
            self.store.set("shm_path", name)
        path = Path(self.store.get("shm_path").decode())
        comm = SharedMemoryComm(path, self.rank, self.size, check_peers=check_peers)
        dist.barrier(group=self.cpu_group)
        if self.rank == 0:
            path.unlink()
        return comm

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place: the end of every row-parallel linear."""
        if self.shm is not None and self.shm.fits(x):
            return self.shm.all_reduce(x)
        dist.all_reduce(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``x`` along the last dim (vocabulary-parallel logits)."""
        if self.shm is not None and self.shm.fits(x):
            return self.shm.all_gather_last(x)
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def min_int(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def broadcast_bytes(self, payload: bytes | None) -> bytes | None:
        """Rank 0 sends ``payload`` (None: the stop signal); every rank returns what was sent."""
        header = torch.tensor([-1 if payload is None else len(payload)], dtype=torch.int64)
        dist.broadcast(header, src=0, group=self.cpu_group)
        n = int(header.item())
        if n <= 0:
            return None if n < 0 else b""
        data = (torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload is not None
                else torch.empty(n, dtype=torch.uint8))
        dist.broadcast(data, src=0, group=self.cpu_group)
        return payload if payload is not None else data.numpy().tobytes()

    def close(self) -> None:
        if self.shm is not None:
            self.shm.close()
            self.shm = None
        if dist.is_initialized():
            dist.destroy_process_group()


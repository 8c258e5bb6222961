"""A tensor-parallel worker rank: ``python -m shared.worker.distributed.worker``.

Rank 0 (the engine core) starts this node's workers itself. On another node, start each rank
by hand with torchrun's variables: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and LOCAL_RANK
for its GPU). The worker reads the engine config from rank 0's store, loads its shard, then
runs every step rank 0 broadcasts until the stop signal.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

import msgspec
import torch

from shared.config import EngineConfig
from shared.processes import watch_parent
from shared.worker.distributed.group import Rendezvous, TensorParallelGroup, open_store
from shared.worker.distributed.launch import (
    CONFIG_KEY,
    START_TIMEOUT_S,
    STEP_TIMEOUT_S,
    report,
    uses_shared_memory,
)
from shared.worker.model_runner import ModelRunner
from shared.worker.step_inputs import decode_step

logger = logging.getLogger("twinserve.tp-worker")


def start(rdv: Rendezvous, model: str | None) -> ModelRunner:
    """Join rank 0, load this rank's shard; any failure is reported to rank 0 first."""
    store = open_store(rdv, None, START_TIMEOUT_S)
    config = msgspec.msgpack.decode(store.get(CONFIG_KEY), type=EngineConfig)
    try:
        device = torch.device(config.model.device)
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rdv.rank)))
        report(store, "joined", rdv.rank)
        tp = TensorParallelGroup(rdv, store, device, STEP_TIMEOUT_S,
                                 uses_shared_memory(config, device))
        if config.parallel.debug_fail_tp_rank == rdv.rank:
            raise RuntimeError(f"injected start-up failure of rank {rdv.rank}")
        return ModelRunner(config, Path(model or config.model.model), tp_worker=tp)
    except BaseException as e:
        report(store, "joined", rdv.rank, error=e)
        raise


def serve_steps(runner: ModelRunner) -> None:
    """Run each broadcast step's forward (this rank's heads) until rank 0 says stop."""
    assert runner.tp is not None
    while (payload := runner.tp.broadcast_bytes(None)) is not None:
        runner.forward_local(runner.model_input(decode_step(payload), []))
    runner.tp.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="the model folder on this node (default: rank 0's path)")
    ap.add_argument("--num-threads", type=int, help="torch intra-op threads")
    ap.add_argument("--parent-pid", type=int, help="exit when this process is gone")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.parent_pid:     # started by rank 0, which decides when this rank stops
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        watch_parent(args.parent_pid)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    rdv = Rendezvous.from_env()
    runner = start(rdv, args.model)
    logger.info("rank %d of %d ready: %d KV blocks", rdv.rank, rdv.world_size, runner.num_blocks)
    serve_steps(runner)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""glibc keeps freed tensor memory once ``keep_freed_memory`` ran: a step's worth of
few-MB activations allocated and freed again and again page-faults once, not every time."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from shared.config import CacheConfig, EngineConfig, ModelConfig
from shared.worker.model_runner import ModelRunner

# Sixteen tensors alive at once, freed together, twenty times, their size changing from round
# to round as a step's does with its rows (1-4 MiB): glibc's defaults map or trim them again
# almost every round; kept, the heap serves every round after the largest from freed memory.
PROBE = """
import resource, sys, torch
from shared.worker.host_malloc import keep_freed_memory
tuned = keep_freed_memory() if sys.argv[1] == "on" else False
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for r in range(20):
    live = [torch.ones((1 + r % 4) << 18) for _ in range(16)]
    del live
print(tuned, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
LARGEST_ROUND_PAGES = 16 * (4 << 20) // 4096
SMALLEST_ROUND_PAGES = 16 * (1 << 20) // 4096


def _faults(mode: str) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], check=True, capture_output=True,
                         text=True).stdout.split()
    return out[0] == "True", int(out[1])


def test_freed_memory_is_reused_instead_of_faulted_in_again() -> None:
    tuned, faults = _faults("on")
    assert tuned
    assert faults < 3 * LARGEST_ROUND_PAGES, faults             # the first rounds, then reuse
    untuned, default_faults = _faults("off")
    assert not untuned
    assert default_faults > 10 * SMALLEST_ROUND_PAGES, default_faults   # why it exists


def test_the_engine_turns_it_on_for_cpu_and_off_when_asked(default_model_dir: str) -> None:
    for keep in (True, False):
        config = EngineConfig(model=ModelConfig(model=default_model_dir, malloc_keep_freed=keep),
                              cache=CacheConfig(num_blocks=16))
        runner = ModelRunner(config, Path(default_model_dir))
        try:
            assert runner.malloc_tuned is keep
        finally:
            runner.close()

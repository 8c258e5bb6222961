"""Keep freed activation memory in the process instead of handing it back to the kernel.

An eager CPU step allocates and frees tens of megabytes per layer (a 1,000-token prefill
of the default model: about 1.2 GB of tensors per step, each a few MB). glibc serves blocks
above its mmap threshold with a fresh ``mmap`` and unmaps them on free, and trims the heap's top
past its trim threshold, so every step page-faults all of that memory in again and the kernel
zeroes it: on a 2-core EPYC that doubled a prefill step's time (README, "host memory").
vLLM's CPU build gets the same effect by preloading tcmalloc; ``mallopt`` does it in process,
with no preload and no new dependency. The cost: the heap stays at its high-water mark.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3     # glibc's <malloc.h>
MMAP_THRESHOLD = 32 << 20       # glibc's largest: blocks up to it come from the reused heap
TRIM_THRESHOLD = 1 << 30        # free memory kept at the heap's top before it is trimmed


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; False where that is not
    possible (not glibc, or ``mallopt`` refused), and the allocator keeps its defaults."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if not ok:
        logger.info("host malloc: mallopt refused; glibc's default thresholds stay")
    return ok

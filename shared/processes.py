"""For processes the engines start beside the API server: v1's engine cores and the
tensor-parallel workers. One parent watch and one CPU split, shared by both."""
from __future__ import annotations

import os
import threading
import time


def watch_parent(parent_pid: int) -> None:
    """Exit (code 1) once ``parent_pid`` is no longer this process's parent, e.g. after a
    SIGKILL of the parent, so no child is orphaned."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def cpu_share(num_processes: int) -> int:
    """Torch threads per process when ``num_processes`` split this process's CPUs (at least 1)."""
    return max(1, len(os.sched_getaffinity(0)) // num_processes)

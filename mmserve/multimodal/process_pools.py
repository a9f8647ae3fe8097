"""Stopping a ``ProcessPoolExecutor`` so that nothing of it outlives the stop.

``shutdown(wait=False)`` returns while the pool's thread is still stopping its processes and
closing its pipe. On Python 3.11 the interpreter's exit wakes every pool's thread through that
pipe without a lock (CPython gh-125451 added one in later releases), so a server that exits
then can print ``OSError: [Errno 9] Bad file descriptor`` with a traceback after a clean stop.
``stop_process_pool`` returns only once the thread and the processes have ended.
"""

from __future__ import annotations

import logging
from concurrent.futures import Executor

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 5.0


def stop_process_pool(pool: Executor, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Cancel ``pool``'s queued jobs and wait up to ``timeout_s`` for its processes to finish
    the jobs they run and exit; processes still running then are terminated.

    The wait reads the pool's thread and processes, which ``ProcessPoolExecutor`` keeps in
    private attributes (the same since Python 3.9); any other executor is only shut down.
    """
    thread = getattr(pool, "_executor_manager_thread", None)
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    if thread is None:
        return
    thread.join(timeout_s)
    if thread.is_alive():
        logger.warning("worker processes still busy after %.1f s; terminating them", timeout_s)
        for process in processes:
            process.terminate()
        thread.join(timeout_s)
    for process in processes:
        process.join(timeout_s)

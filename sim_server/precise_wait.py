"""Waiting for a precise duration inside an event loop.

asyncio timers fire on whole milliseconds here (a 1.6 ms sleep takes about 2.1 ms), which
would inflate an emulated 1.6 ms step by a third. We sleep on the loop for all but the last
2 ms, then finish in a worker thread with time.sleep (clock_nanosleep, ~0.1 ms precise),
which keeps the loop free for other calls. The caller gets the wait actually made.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

_LOOP_SLACK_S = 0.002
# Many concurrent calls may each be finishing a wait; threads only sleep, so many are cheap.
_WAIT_THREADS = ThreadPoolExecutor(max_workers=64, thread_name_prefix="precise-wait")


async def precise_wait(seconds: float) -> float:
    """Wait `seconds` without blocking the loop; returns the seconds actually waited."""
    start = time.perf_counter()
    if seconds <= 0:
        return 0.0
    coarse = seconds - _LOOP_SLACK_S
    if coarse > 0:
        await asyncio.sleep(coarse)
    remaining = seconds - (time.perf_counter() - start)
    if remaining > 0:
        await asyncio.get_running_loop().run_in_executor(_WAIT_THREADS, time.sleep, remaining)
    return time.perf_counter() - start

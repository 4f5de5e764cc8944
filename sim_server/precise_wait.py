"""Waiting for a precise duration inside an event loop.

asyncio timers fire on whole milliseconds here (a 1.6 ms sleep takes about 2.1 ms), which
would inflate an emulated 1.6 ms step by a third. We sleep on the loop for all but the last
2 ms, then finish in a worker thread, which keeps the loop free for other calls: time.sleep
until shortly before the deadline (it oversleeps by ~0.1 ms), then yield-spin to it
(time.sleep(0) releases the GIL each turn). Handing the result back to the loop takes about
0.1 ms, so the thread stops that much early. Measured here: 1.6 ms waits 1.61 ms (median;
p10 1.54, p90 1.63). The caller gets the wait actually made.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

_LOOP_SLACK_S = 0.002
_SLEEP_SLACK_S = 0.0002  # time.sleep's usual overshoot here; the rest is spun
_HANDBACK_S = 0.0001  # waking the loop from the worker thread (measured ~0.1 ms here)
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
    deadline = start + seconds - _HANDBACK_S
    if deadline > time.perf_counter():
        await asyncio.get_running_loop().run_in_executor(_WAIT_THREADS, _sleep_until, deadline)
    return time.perf_counter() - start


def _sleep_until(deadline: float) -> None:
    coarse = deadline - time.perf_counter() - _SLEEP_SLACK_S
    if coarse > 0:
        time.sleep(coarse)
    while time.perf_counter() < deadline:
        time.sleep(0)

"""When the event loop last woke from waiting: how much of a call's work on the broker's thread comes
after its answer is in.

A call holds the broker's one thread twice: to send it (encoding the request, starting the call)
before the loop has nothing left to do and waits, and to receive it (decoding the answer, the pool
assembling the outcome) once the answer wakes the loop. In a lock-step row the receive of the last
answer is the row's tail; in VER, where the servers' answers come at their own times, a receive
waits for whatever else holds the thread then (another server's slots, their forward pass), which
a call whose whole thread work came before it would not (model.py `call_receive_cpu_s`).

`LastWake` notes the thread's CPU time each time the running loop returns from a wait for I/O: a
`select` with a timeout other than 0, which asyncio's selector loop makes only when nothing is ready
to run. The thread CPU from the last such return to the end of a call is its receive. It reads the
loop's selector, which asyncio does not publish (`_selector`); on a loop without one (uvloop, the
proactor loop on Windows) it measures nothing and says so (`available`).
"""

from __future__ import annotations

import asyncio
import time


class LastWake:
    """Within `with`: `cpu_s`, the thread CPU time when the loop last woke from waiting, or None
    since `clear()`."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.selector = getattr(loop or asyncio.get_running_loop(), "_selector", None)
        self.available = self.selector is not None and hasattr(self.selector, "select")
        self.cpu_s: float | None = None

    def clear(self) -> None:
        self.cpu_s = None

    def __enter__(self) -> LastWake:
        if self.available:
            select = self.selector.select

            def watched(timeout=None):
                ready = select(timeout)
                if timeout != 0:  # the loop had nothing to run and waited for I/O
                    self.cpu_s = time.thread_time()
                return ready

            self.selector.select = watched  # on the instance: the class's stays as it was
        return self

    def __exit__(self, *_) -> None:
        if self.available:
            del self.selector.select

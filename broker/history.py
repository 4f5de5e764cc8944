"""The last iterations' metrics in memory, for GetMetricsHistory and WatchMetrics.

Iterations are appended in order (1, 2, 3, ...); the oldest fall off past `capacity`. Watchers
follow the history with an event each, set on every append and on close: no polling, and a
watcher that goes away (its generator closed or cancelled) takes its event with it. When the learner
restarts from an older checkpoint, the iterations past it are dropped (`drop_from_version`) and
numbered again as they are trained again; a watcher past them follows on from the last one kept.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator

HISTORY_CAPACITY = 10_000  # iterations held in memory
HISTORY_PAGE = 1_000  # GetMetricsHistory's most per call (its max_count 0 means this)


class MetricsHistory:
    def __init__(self, capacity: int = HISTORY_CAPACITY) -> None:
        self._held: deque[dict] = deque(maxlen=capacity)
        self._watchers: set[asyncio.Event] = set()
        self._closed = False
        self._rewinds = 0  # how many times iterations were dropped from the tail
        self._last_kept = 0  # the iteration the last drop left the history at

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def watchers(self) -> int:
        """Watchers following now (a test checks that none leaks)."""
        return len(self._watchers)

    def append(self, metrics: dict) -> None:
        """One iteration's metrics (its "iteration" one more than the last's); wakes every watcher."""
        self._held.append(metrics)
        self._wake()

    def drop_from_version(self, version: int) -> int:
        """Drop the held iterations of policy_version >= `version` (the newest ones: the learner resumed
        from the checkpoint of `version`); returns how many. The iterations kept stay consecutive."""
        dropped = 0
        while self._held and self._held[-1]["policy_version"] >= version:
            self._last_kept = self._held.pop()["iteration"] - 1
            dropped += 1
        if dropped:
            self._rewinds += 1
        return dropped

    def close(self) -> None:
        """No iteration follows (the run is over): watchers get what is held, then their streams end."""
        self._closed = True
        self._wake()

    def since(self, iteration: int, max_count: int = HISTORY_PAGE) -> list[dict]:
        """Up to `max_count` held iterations > `iteration`, the oldest first."""
        if not self._held:
            return []
        # Held iterations are consecutive, so the first one wanted sits at a known offset.
        start = max(iteration - self._held[0]["iteration"] + 1, 0)
        return list(itertools.islice(self._held, start, start + max(max_count, 0)))

    async def follow(self, since_iteration: int) -> AsyncIterator[dict]:
        """Held iterations > since_iteration, then each new one as it is appended; ends after close().

        Iterations that fell off the history while the watcher was slow are skipped.
        """
        woken = asyncio.Event()
        self._watchers.add(woken)
        try:
            cursor, rewinds = since_iteration, self._rewinds
            while True:
                woken.clear()  # before reading: an append from here on sets it again
                if rewinds != self._rewinds:  # iterations dropped: follow on from the last one kept
                    cursor, rewinds = min(cursor, self._last_kept), self._rewinds
                batch = self.since(cursor)
                for metrics in batch:
                    cursor = metrics["iteration"]
                    yield metrics
                if batch:
                    continue
                if self._closed:
                    return
                await woken.wait()
        finally:
            self._watchers.discard(woken)

    def _wake(self) -> None:
        for event in self._watchers:
            event.set()

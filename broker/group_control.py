"""When a broker pauses and stops: at its own next boundary alone, or at one its learner ranks agree on.

A broker alone (its learner a single process) pauses or stops at its next iteration boundary. A run of
R learner ranks has a broker per rank, and every update waits for every broker's batch of the same
version. A pause or stop reaches the brokers at different moments, so taken at each broker's own
boundary it can catch one broker done with iteration N and another already sampling N + 1: the second's
batch then waits in the ranks' reduction for a partner that never comes, and the group fails after
`rank_timeout_s` (a stop hangs the run until then).

So a broker of ranks only *asks*: the next batch it submits carries the request
(SubmitBatchRequest.pause_requested / stop_requested), the ranks share every broker's requests with the
update, and every rank's answer says whether any broker asked (run_pauses / run_stops). Every broker
then pauses or stops after that same iteration. The price: asked at a boundary, or while paused, a
broker of ranks samples one more iteration before it pauses or stops.

A resume that comes after the batch carrying a pause request went out cancels that pause on this
broker: it samples on, and its next batch waits (no longer than the pause) for the brokers that did
pause, which the same resume reaches.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


class GroupControl:
    """Pause, resume and stop of one broker, given `world_size`, its learner's ranks (1: alone)."""

    def __init__(self) -> None:
        self.world_size = 1
        self.running = asyncio.Event()  # cleared while paused: the loop waits on it at each boundary
        self.running.set()
        self.pause_requested = False
        self.stop_requested = False
        self.stopped = False  # the run ends at the next boundary
        self._resumes = 0  # resume() calls so far: a pause agreed for an older request is void after one

    @property
    def alone(self) -> bool:
        return self.world_size <= 1

    def pause(self) -> None:
        self.pause_requested = True
        if self.alone:
            self.running.clear()

    def resume(self) -> None:
        self.pause_requested = False
        self._resumes += 1
        self.running.set()

    def stop(self) -> None:
        self.stop_requested = True
        if self.alone:
            self.stopped = True
        self.running.set()  # a paused broker goes on: to its end, or (of ranks) to the agreed iteration

    @property
    def pause_pending(self) -> bool:
        """Asked to pause, the ranks' agreement not back yet: the state reads PAUSING."""
        return self.pause_requested and self.running.is_set() and not self.stop_requested

    def requests(self) -> Requests:
        """What the next batch carries to the learner; hand it back to `agreed` with the answer."""
        return Requests(pause=self.pause_requested, stop=self.stop_requested, resumes=self._resumes)

    def agreed(self, sent: Requests, *, run_pauses: bool, run_stops: bool) -> None:
        """An update's answer: whether any broker of the run asked to pause or stop with its batch."""
        if run_stops:
            self.stopped = True
        elif run_pauses and self._resumes == sent.resumes:
            self.running.clear()


@dataclass(frozen=True)
class Requests:
    """The requests one batch carried, and how many resumes had come before it went out."""

    pause: bool
    stop: bool
    resumes: int

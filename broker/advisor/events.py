"""A small discrete-event kernel for the advisor's model (model.py): simulated time, no waiting.

Processes are generators that yield what they wait for: an `Event` (a timeout, another process,
a lock's turn) or a number of seconds. Time moves only from one event to the next, so a model of
thousands of slot-steps runs in a fraction of a second. Events due at the same time run in the
order they were scheduled, as asyncio's ready queue runs callbacks, so the broker's own
orderings (a batcher's flush queued behind the slots woken with it) carry over, and every run
of the same model is the same run.

The resources are those of the cost model (sim_server/cost_model.py), built the same way: a
FIFO `Lock` (the reset engine, the load channel, the broker's one thread) and `Turns` (Steps and
the fixed parts of resets taking turns on one engine, `reset_blocks_steps`).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Generator, Iterable
from typing import Any

Process = Generator[Any, Any, Any]


class Event:
    """Something that happens once; callbacks added before or after run (in scheduled order) once it has."""

    __slots__ = ("sim", "triggered", "value", "_callbacks")

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.triggered = False
        self.value: Any = None
        self._callbacks: list[Callable[[Event], None]] = []

    def succeed(self, value: Any = None) -> None:
        if self.triggered:
            raise RuntimeError("an event happens once")
        self.triggered, self.value = True, value
        for callback in self._callbacks:
            self.sim.soon(callback, self)
        self._callbacks = []

    def on(self, callback: Callable[[Event], None]) -> None:
        if self.triggered:
            self.sim.soon(callback, self)
        else:
            self._callbacks.append(callback)


class Sim:
    """The clock and its queue of callbacks."""

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable, tuple]] = []
        self._order = itertools.count()

    def call_at(self, when: float, callback: Callable, *args: Any) -> None:
        heapq.heappush(self._queue, (max(when, self.now), next(self._order), callback, args))

    def soon(self, callback: Callable, *args: Any) -> None:
        self.call_at(self.now, callback, *args)

    def timeout(self, seconds: float) -> Event:
        event = Event(self)
        self.call_at(self.now + max(float(seconds), 0.0), event.succeed)
        return event

    def event(self) -> Event:
        return Event(self)

    def process(self, generator: Process) -> Event:
        """Start `generator` now; the event it returns happens with its return value when it returns."""
        done = Event(self)
        self._resume(generator, done, None)
        return done

    def _resume(self, generator: Process, done: Event, value: Any) -> None:
        try:
            target = generator.send(value)
        except StopIteration as stop:
            done.succeed(stop.value)
            return
        if not isinstance(target, Event):  # a number of seconds
            target = self.timeout(target)
        target.on(lambda event: self._resume(generator, done, event.value))

    def all_of(self, events: Iterable[Event]) -> Event:
        """Happens once every one of `events` has (at once when there are none), like asyncio.gather."""
        events = list(events)
        done = Event(self)
        left = [len(events)]
        if not events:
            done.succeed([])
            return done

        def one(_: Event) -> None:
            left[0] -= 1
            if left[0] == 0:
                done.succeed([e.value for e in events])

        for event in events:
            event.on(one)
        return done

    def run(self, until: Event | None = None) -> None:
        """Run callbacks in time order until `until` has happened or nothing is left to run."""
        while self._queue and not (until is not None and until.triggered):
            when, _, callback, args = heapq.heappop(self._queue)
            self.now = when
            callback(*args)
        if until is not None and not until.triggered:
            raise RuntimeError("the model stalled: nothing left to run and the awaited event never happened")


class Lock:
    """A FIFO lock, as asyncio.Lock grants its waiters in order."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.held = False
        self._waiters: deque[Event] = deque()

    def acquire(self) -> Event:
        event = Event(self.sim)
        if self.held:
            self._waiters.append(event)
        else:
            self.held = True
            event.succeed()
        return event

    def release(self) -> None:
        if self._waiters:
            self._waiters.popleft().succeed()  # handed over: stays held
        else:
            self.held = False


class Turns:
    """Steps and fixed parts of resets taking turns on one engine: sim_server/cost_model.py's
    `StepTurns`, in simulated time. Many Steps at once, or fixed parts, never both; a fixed part
    counts from when it asks, so Steps arriving after it wait for it."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.steps = 0
        self.fixed_parts = 0
        self._waiters: list[Event] = []

    def step(self) -> Process:
        yield from self._until(lambda: self.fixed_parts == 0)
        self.steps += 1

    def step_done(self) -> None:
        self.steps -= 1
        if self.steps == 0:
            self._wake()

    def fixed_part(self) -> Process:
        self.fixed_parts += 1
        yield from self._until(lambda: self.steps == 0)

    def fixed_part_done(self) -> None:
        self.fixed_parts -= 1
        if self.fixed_parts == 0:
            self._wake()

    def _until(self, ready: Callable[[], bool]) -> Process:
        while not ready():  # checked again on every wake-up, as StepTurns does
            waiter = Event(self.sim)
            self._waiters.append(waiter)
            yield waiter

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.succeed()

"""The rounds of a lock-step mode with rounds (sgr, fast): `Rounds`, which the sampler owns
(lockstep.py), holds who is in the current round and which members are done at which row, and
steps a round server by server, optionally pipelined, until the mode's rule ends it.

Each simulator server's slots are a group: one forward pass (on the group's own noise stream,
broker/policy_runner.py) and one Step call per group and row. Unpipelined, a row starts only
when the previous one is complete and the rule said the round goes on: the classic lock-step.

Pipelined, a server whose answer is in steps its next row at once, while the other servers are
still stepping the current one, so inference and transport for one server overlap stepping on
another. That next row is speculative: the round may end at the current row (DPSA's alpha is
reached by the slower servers' answers). Its answer is therefore held, not applied, until the
current row is judged; if the round goes on it is applied as if it had been stepped then. If the
round ends, what happens to it follows the rule's truncation:
- `reset` (sgr, fast's literal reading): it is thrown away: its row leaves the batch, the group's
  noise stream is rewound to before it, and the slots' simulator state does not matter, as the
  round's end resets every slot. Every decision is taken on exactly the figures of the
  unpipelined run, so the batch is the same array for array (tests/test_pipelined_rounds.py);
  the price is at most one thrown-away Step call per server and round, counted in `steps_discarded`.
- `carry` (fast's default): the simulators have stepped those slots and their episodes go on,
  so the step cannot be undone: it is kept. It was sampled with this iteration's policy, so it is
  an on-policy transition of this batch: the row past the end stays, holding the speculative
  groups' steps (the other slots are padding there), and those slots are truncated at it instead
  of at the round's last row. The batch then differs from the unpipelined run's by those steps.

A group runs at most one row ahead of the last row judged: its next row needs its held answer.
With a single server there is nothing to overlap: the round runs unpipelined (the same batch, without
the tasks and the bookkeeping of speculation, which cost 5 to 10% of a 1.6 ms step there).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from broker.metrics import IterationStats
    from broker.policy_runner import PolicyRunner
    from broker.recorder import RolloutRecorder
    from broker.slots import PoolStep, SlotPool

    # The sampler's `apply_step`: a Step answer for positions `idx` at `row` into the batch and the
    # slots' state (obs, live, episode lengths); returns the positions whose episode ended.
    ApplyStep = Callable[[int, np.ndarray, PoolStep, np.ndarray, RolloutRecorder, IterationStats], np.ndarray]

NOT_DONE = np.iinfo(np.int64).max


class RoundRule(Protocol):
    """What a round reads of its mode's rule (lockstep.py `LockstepRule`)."""

    @property
    def carries(self) -> bool:
        """True: the round's end truncates live episodes in the batch but does not end them."""
        ...

    def round_over(self, *, ended: np.ndarray, live: np.ndarray, done: np.ndarray, steps: int) -> bool: ...


@dataclass
class _Call:
    group: int
    row: int
    acting: np.ndarray  # positions into the sampler's slots
    values: np.ndarray  # V(obs) of those slots: the bootstrap value if their step fails
    noise_state: dict | None  # a speculative row's: the group's noise stream before its draw
    result: PoolStep | None = None  # a speculative answer, held until the row before is judged


class Rounds:
    """A lock-step sampler's rounds over `slots` (global ids; positions index every array here).

    `obs` and `live` are the sampler's own arrays (the observation each slot last received; a
    live episode runs in it), which it and `apply_step` update in place; the rounds read them.
    """

    def __init__(
        self,
        pool: SlotPool,
        runner: PolicyRunner,
        slots: np.ndarray,
        *,
        obs: np.ndarray,
        live: np.ndarray,
        apply_step: ApplyStep,
        pipelined: bool = False,
    ) -> None:
        self.pool, self.runner, self.slots = pool, runner, slots
        self.obs, self.live, self.apply_step = obs, live, apply_step
        self.pipelined = pipelined  # a server that answered steps on while others still step
        n = slots.size
        self.members = np.zeros(n, dtype=bool)  # slots with a live episode when this round started
        self.done = np.zeros(n, dtype=bool)  # members whose episode ended (or failed) this round
        self.done_row = np.full(n, NOT_DONE, dtype=np.int64)  # the batch row at which each member was done

    def open(self, members: np.ndarray) -> None:
        """A round starts with these members (bool per slot); none of them is done yet."""
        self.members[:] = members
        self.done[:] = False
        self.done_row[:] = NOT_DONE

    def mark_done(self, positions: np.ndarray, row: int) -> None:
        """These slots' episodes ended (or their simulator failed) at `row`."""
        self.done[positions] = True
        self.done_row[positions] = row

    def _up(self) -> np.ndarray:
        return self.pool.up_mask()[self.slots]

    def _apply(self, recorder, stats, row, idx, result, values) -> np.ndarray:
        """A Step answer for slots `idx` at `row` into the batch and the round's state; the slots
        whose episode ended."""
        ended = self.apply_step(row, idx, result, values, recorder, stats)
        self.mark_done(ended, row)
        return ended

    async def step(self, rule: RoundRule, recorder: RolloutRecorder, stats: IterationStats) -> int:
        """Step the round that `open` started until `rule` ends it; the last row.

        Returns recorder.num_rows - 1 when no slot acts at all (every reset failed)."""
        groups = self.pool.by_server(self.slots)  # positions into self.slots, per server
        if not self.pipelined or len(groups) == 1:  # one server has no other to overlap with: the plain path costs less
            return await self._lockstep(rule, recorder, stats, groups)
        return await self._pipelined(rule, recorder, stats, groups)

    async def _pipelined(
        self, rule: RoundRule, recorder: RolloutRecorder, stats: IterationStats, groups: dict[int, np.ndarray]
    ) -> int:
        """The round pipelined: a server whose answer is in steps its next row at once (module docstring)."""
        first = recorder.num_rows
        next_row = dict.fromkeys(groups, first)
        finished: set[int] = set()  # groups with no slot left to act this round
        in_flight: dict[asyncio.Future, _Call] = {}
        held: list[_Call] = []  # speculative answers of row decided + 2
        server_s: dict[int, float] = {}  # per row: the slowest server's own time
        ended_at: dict[int, list[np.ndarray]] = {}  # per row: slots whose episode ended there
        decided = first - 1  # the last row judged: the round goes on after it
        members = np.flatnonzero(self.members)

        def start(g: int, row: int) -> None:
            positions = groups[g]
            acting = positions[self.live[positions] & self._up()[positions]]
            if acting.size == 0:
                finished.add(g)
                return
            if row == recorder.num_rows:
                recorder.new_row()
            speculative = row > decided + 1
            state = self.runner.noise_state(g) if speculative else None  # to rewind a row thrown away
            t0 = time.perf_counter()
            decision = self.runner.act(self.obs[acting], stream=g)
            stats.inference_s += time.perf_counter() - t0
            recorder.put(row, acting, self.obs[acting], decision.actions, decision.logprobs, decision.values)
            call = asyncio.ensure_future(self.pool.step(self.slots[acting], decision.env_actions))
            in_flight[call] = _Call(g, row, acting, decision.values, state)
            next_row[g] = row + 1
            stats.steps_ahead += speculative

        def may_start(g: int) -> bool:
            busy = any(c.group == g for c in (*in_flight.values(), *held))
            return not busy and g not in finished and next_row[g] <= decided + 2

        def row_complete(row: int) -> bool:
            return not any(c.row == row for c in in_flight.values()) and all(
                next_row[g] > row for g in groups if g not in finished
            )

        def apply(call: _Call, result: PoolStep) -> None:
            server_s[call.row] = max(server_s.get(call.row, 0.0), result.server_s)
            ended_at.setdefault(call.row, []).append(
                self._apply(recorder, stats, call.row, call.acting, result, call.values)
            )

        def judge(row: int) -> bool:
            """Is the round over after `row`?"""
            ended = np.concatenate(ended_at[row]) if ended_at.get(row) else np.zeros(0, dtype=np.int64)
            done_by_row = self.done_row <= row
            stats.transitions += int(self._up().sum())  # every slot of an up server holds its place in the row
            stats.step_server_s += server_s.get(row, 0.0)
            return rule.round_over(
                ended=ended, live=self.members & ~done_by_row, done=done_by_row[members], steps=row - first + 1
            )

        async def keep_speculation() -> None:
            """The round ended and its live episodes carry on: the Step calls past the end stepped
            their simulators, so their answers go into the row after the last (fast.py, `carry`)."""
            if in_flight:
                t0 = time.perf_counter()
                await asyncio.gather(*in_flight)
                stats.step_wall_s += time.perf_counter() - t0
            for future, call in in_flight.items():
                call.result = future.result()
                held.append(call)
            in_flight.clear()
            kept = sorted(held, key=lambda c: c.group)
            held.clear()
            for call in kept:
                apply(call, call.result)
            if kept:  # the kept row holds its place in the batch like any other
                stats.transitions += int(self._up().sum())
                stats.step_server_s += server_s.get(decided + 2, 0.0)

        async def throw_away_speculation() -> None:
            """The round ended: wait for the Step calls still out (a server steps one call at a time),
            then forget the rows past the end: their batch row, their noise draws."""
            if in_flight:
                t0 = time.perf_counter()
                await asyncio.gather(*in_flight)
                stats.step_wall_s += time.perf_counter() - t0
            speculative = [*held, *in_flight.values()]
            for call in speculative:
                self.runner.rewind_noise(call.group, call.noise_state)
            stats.steps_discarded += len(speculative)
            in_flight.clear()
            held.clear()
            recorder.drop_rows(decided + 2)

        for g in groups:
            start(g, first)
        if not in_flight:
            return recorder.num_rows - 1
        try:
            while True:
                # Judge every row all groups have stepped, in order; answers held for the next row then count.
                while decided + 1 < recorder.num_rows and row_complete(decided + 1):
                    if judge(decided + 1):
                        await (keep_speculation() if rule.carries else throw_away_speculation())
                        return decided + 1
                    decided += 1
                    for call in sorted(held, key=lambda c: c.group):
                        apply(call, call.result)
                    held.clear()
                for g in groups:
                    if may_start(g):
                        start(g, next_row[g])
                if not in_flight:  # nothing acts any more and the rule did not end the round: end it here
                    return recorder.num_rows - 1
                t0 = time.perf_counter()
                done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                stats.step_wall_s += time.perf_counter() - t0
                for future in sorted(done, key=lambda f: (in_flight[f].row, in_flight[f].group)):
                    call = in_flight.pop(future)
                    if call.row <= decided + 1:
                        apply(call, future.result())
                    else:
                        call.result = future.result()
                        held.append(call)
        finally:
            for future in in_flight:
                future.cancel()

    async def _lockstep(
        self, rule: RoundRule, recorder: RolloutRecorder, stats: IterationStats, groups: dict[int, np.ndarray]
    ) -> int:
        """The round unpipelined: every row, each server's slots act on its own stream (the same draws
        as pipelined), then one Step call per server, all at once, and the row is judged."""
        first = recorder.num_rows
        members = np.flatnonzero(self.members)
        while True:
            up = self._up()
            acting = self.live & up
            if not acting.any():
                return recorder.num_rows - 1
            row = recorder.new_row()
            parts, values, env_actions = [], [], []
            row_started = t0 = time.perf_counter()
            for g, positions in groups.items():
                idx = positions[acting[positions]]
                if idx.size:
                    decision = self.runner.act(self.obs[idx], stream=g)
                    recorder.put(row, idx, self.obs[idx], decision.actions, decision.logprobs, decision.values)
                    parts.append(idx)
                    values.append(decision.values)
                    env_actions.append(decision.env_actions)
            inference = time.perf_counter() - t0
            stats.inference_s += inference
            idx = np.concatenate(parts)
            t0 = time.perf_counter()
            result = await self.pool.step(self.slots[idx], np.concatenate(env_actions))
            stats.step_wall_s += time.perf_counter() - t0
            stats.step_server_s += result.server_s
            stats.transitions += int(up.sum())  # every slot of an up server holds its place in the row
            ended = self._apply(recorder, stats, row, idx, result, np.concatenate(values))
            over = rule.round_over(ended=ended, live=self.live, done=self.done[members], steps=row - first + 1)
            # The row's cost against how many slots acted on its busiest server (alpha auto fits one to the other).
            stats.row_steps.append((max(p.size for p in parts), time.perf_counter() - row_started - inference))
            if over:
                return row

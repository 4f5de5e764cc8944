"""The lock-step loop that `sc`, `autoreset`, `sgr` and `fast` share; each mode's rule is a
`LockstepRule` in a module of its own name (sc.py, autoreset.py, sgr.py, fast.py).

Every step: one row of the [T, N] batch, one Step call per server (concurrent). Without rounds,
one forward pass for all the slots that act; with rounds, one per server, each on the server's
own noise stream, and a server that answered may step on while the others still step, the rows
judged as the classic lock-step judges them (rounds.py: `Rounds`, which the sampler owns).
Then the mode's rule says what happens when episodes end:
- without rounds (sc, autoreset): a slot whose episode ended is reset at once, on its own
  (one Reset call per slot, as each env of a Gymnasium vector env resets itself); live
  episodes carry across iterations (truncated and bootstrapped at the iteration's end);
- with rounds (sgr, fast): a round starts with one batched Reset per server for every slot
  without a live episode (one per slot for a server whose Capabilities say it resets one slot
  per call, broker/pool.py); when the rule says the round is over, live slots are truncated
  (bootstrapped) and the next round starts. Whether their episodes then go on (fast's `carry`)
  or are reset with the others (sgr, fast's `reset`) is the rule's `truncation`. Every iteration
  ends at a round boundary; carried episodes go on into the next iteration, as sc's and
  autoreset's do, each new segment starting from its own first observation.

Faults: a slot whose server fails (or answers against the contract, broker/answers.py) is
padding from that step; its previous step, if it was open, is truncated and bootstrapped from
V of the observation the slot last received.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from broker.metrics import IterationStats
from broker.recorder import RolloutRecorder
from broker.samplers.base import SamplingError
from broker.samplers.rounds import Rounds

if TYPE_CHECKING:
    from broker.dealer import ClipDealer
    from broker.policy_runner import PolicyRunner
    from broker.slots import PoolStep, SlotPool


class LockstepRule:
    """What one lock-step mode decides; `LockstepSampler` does everything else."""

    name: ClassVar[str]
    # True: the mode runs in rounds, each opened by one batched global reset and closed by a
    # global truncation when `round_over` says so. False: ended slots are reset one by one.
    rounds: ClassVar[bool] = False
    # At a round's end: "reset" every slot, or "carry" the live episodes on (fast.py).
    truncation: ClassVar[str] = "reset"

    @classmethod
    def configured(cls, *, alpha: float, t_max: int, truncation: str = "carry") -> LockstepRule:
        """The rule for a run's settings; only DPSA reads alpha, t_max and truncation."""
        return cls()

    @property
    def carries(self) -> bool:
        """True: a round's end truncates live episodes in the batch but does not end them."""
        return False

    def drives(self, slots: np.ndarray) -> np.ndarray:
        """The slots (global ids) the mode steps, out of those it is offered."""
        return slots

    def round_over(self, *, ended: np.ndarray, live: np.ndarray, done: np.ndarray, steps: int) -> bool:
        """After a lock-step step of a round: must the round end now?

        ended: positions of the slots whose episode ended at this step; live: bool [n], a live
        episode runs in the slot; done: bool per round member (slots reset at the round's start),
        its episode ended or its simulator failed this round; steps: lock-step steps in the round.
        """
        raise NotImplementedError(f"mode {self.name} has no rounds")


class LockstepSampler:
    def __init__(
        self,
        pool: SlotPool,
        runner: PolicyRunner,
        dealer: ClipDealer,
        rule: LockstepRule,
        *,
        samples_per_iteration: int,
        stall_timeout_s: float = 60.0,
        slots: np.ndarray | None = None,
        prefetch: bool = False,
        pipeline: bool = False,
    ) -> None:
        self.pool, self.runner, self.dealer = pool, runner, dealer
        self.rule = rule
        self.prefetch = prefetch
        self.samples_per_iteration = samples_per_iteration
        self.stall_timeout_s = stall_timeout_s
        # Global ids of the slots this sampler drives (those offered, all by default, as the rule picks).
        slots = np.arange(pool.num_slots) if slots is None else np.asarray(slots, dtype=np.int64)
        self.slots = rule.drives(slots)
        n = self.slots.size
        space = pool.observation_space
        self.obs = np.zeros((n, *space.shape), dtype=space.dtype)
        self.live = np.zeros(n, dtype=bool)  # a live episode runs in the slot
        self.episode_len = np.zeros(n, dtype=np.int64)
        # The modes with rounds: the current round's members and their ends, and its stepping (rounds.py);
        # `pipeline`: a server that answered steps on while others still step.
        self.rounds = (
            Rounds(
                pool, runner, self.slots, obs=self.obs, live=self.live, apply_step=self.apply_step, pipelined=pipeline
            )
            if rule.rounds
            else None
        )
        # Prefetch: each slot's next clip and seed, dealt ahead and being prepared by its server (-1: none).
        self.next_clip = np.full(n, -1, dtype=np.int64)
        self.next_seed = np.zeros(n, dtype=np.int64)

    @property
    def mode(self) -> str:
        return self.rule.name

    def apply_settings(self, *, samples_per_iteration: int, alpha: float, t_max: int) -> None:
        # Every iteration ends at a round boundary (or, without rounds, between steps), so a new
        # rule takes over cleanly; live episodes of sc and autoreset carry on.
        self.samples_per_iteration = samples_per_iteration
        self.rule = type(self.rule).configured(alpha=alpha, t_max=t_max, truncation=self.rule.truncation)

    @property
    def pipeline(self) -> bool:
        return self.rounds is not None and self.rounds.pipelined

    def _up(self) -> np.ndarray:
        return self.pool.up_mask()[self.slots]

    async def _reset(
        self, positions: np.ndarray, *, batched: bool, stats: IterationStats, calls_into: list | None = None
    ) -> np.ndarray:
        """Reset slots (positions into self.slots) onto freshly dealt clips; returns which succeeded
        (and each answered call's (slots, wall s) into `calls_into`)."""
        if positions.size == 0:
            return np.zeros(0, dtype=bool)
        clips, seeds = self._clips_for(positions)
        started = time.perf_counter()
        result = await self.pool.reset(self.slots[positions], clips, seeds, batched=batched)
        stats.reset_wall_s += time.perf_counter() - started
        if calls_into is not None:
            calls_into.extend(result.call_walls)
        stats.reset_server_s += result.server_s
        stats.reset_calls += result.calls  # one per server when batched, unless a server takes one slot per call
        ok = ~result.failed
        done = positions[ok]
        self.obs[done] = result.observations[ok]
        self.live[done] = True
        self.episode_len[done] = 0
        stats.slot_resets += done.size
        return ok

    def _clips_for(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The clips these slots start next: those dealt ahead for them (prefetch), the others dealt now."""
        ahead = self.next_clip[positions] >= 0
        clips, seeds = self.next_clip[positions].copy(), self.next_seed[positions].copy()
        if not ahead.all():
            fresh = positions[~ahead]
            clips[~ahead], seeds[~ahead] = self.dealer.deal(fresh.size, self.pool.slot_server[self.slots[fresh]])
        self.next_clip[positions] = -1
        return clips, seeds

    async def _prepare_next(self, positions: np.ndarray) -> None:
        """Prefetch: deal these slots' next clips now and have their servers start loading them
        while the slots step (servers without Prepare load them at the Reset, as always).

        The clips are dealt in the same order as without prefetch (a round's slots together, at the
        start of the round before), so with every server up a run plays the same clips and seeds."""
        if not self.prefetch:
            return
        free = positions[self.next_clip[positions] < 0]
        if free.size == 0:
            return
        clips, seeds = self.dealer.deal(free.size, self.pool.slot_server[self.slots[free]])
        self.next_clip[free], self.next_seed[free] = clips, seeds
        await self.pool.prepare(self.slots[free], clips, seeds)

    async def _wait_for_a_server(self, stats: IterationStats) -> None:
        """Retry down servers (with their backoff) until one is up; bounded by stall_timeout_s."""
        deadline = time.monotonic() + self.stall_timeout_s
        while not self._up().any():
            servers = [self.pool.servers[s] for s in np.unique(self.pool.slot_server[self.slots])]
            if all(s.dropped for s in servers):  # waiting cannot help: none of them comes back
                errors = "; ".join(f"{s.address}: {s.last_error}" for s in servers)
                raise SamplingError(f"every simulator was dropped ({errors})")
            if time.monotonic() > deadline:
                errors = "; ".join(f"{s.address}: {s.last_error}" for s in self.pool.servers)
                raise SamplingError(f"no simulator answered for {self.stall_timeout_s:g} s ({errors})")
            await self.pool.readmit_due()
            if not self._up().any():
                await asyncio.sleep(0.05)

    async def _start_round(self, stats: IterationStats) -> None:
        """The round's batched reset of every slot without a live episode (every slot, unless the
        rule carries episodes over); its members are then every slot with a live episode."""
        await self.pool.readmit_due()
        if not self._up().any():
            await self._wait_for_a_server(stats)
        up = self._up()
        fresh = np.flatnonzero(up & ~self.live) if self.rule.carries else np.flatnonzero(up)
        ok = await self._reset(fresh, batched=True, stats=stats, calls_into=stats.round_resets)
        await self._prepare_next(fresh[ok])  # their next clips load while this round steps
        if fresh.size or not self.rule.carries:
            stats.global_resets += 1
        self.rounds.open(self.live & up)

    def _end_round(self, row: int, recorder: RolloutRecorder, stats: IterationStats) -> None:
        """Global truncation: every live episode is truncated in the batch and bootstrapped from
        V of its next observation, at its last row (`row`, or the row after for slots whose step
        past the end was kept, rounds.py); then cut, or carried on into the next round."""
        last = recorder.num_rows - 1
        for s in np.flatnonzero(self.live):
            at = last if last > row and recorder.is_open(last, int(s)) else row
            recorder.truncate(at, int(s), next_obs=self.obs[s])
            if not self.rule.carries:
                stats.record_episode(int(self.episode_len[s]), "cut")
        if not self.rule.carries:
            self.live[:] = False

    async def _refill(self, stats: IterationStats) -> None:
        """Modes without rounds: reset every slot without a live episode whose server is up."""
        if not self._up().all():
            await self.pool.readmit_due()
        idle = np.flatnonzero(~self.live & self._up())
        ok = await self._reset(idle, batched=False, stats=stats)
        await self._prepare_next(idle[ok])  # each slot's next clip loads while its episode runs
        if not self.live.any():
            await self._wait_for_a_server(stats)
            idle = np.flatnonzero(~self.live & self._up())
            ok = await self._reset(idle, batched=False, stats=stats)
            await self._prepare_next(idle[ok])

    async def sample(self) -> tuple[dict[str, np.ndarray], IterationStats]:
        n = self.slots.size
        stats = IterationStats(self.mode, n)
        recorder = RolloutRecorder.for_spaces(n, self.pool.observation_space, self.pool.action_space)
        started = time.perf_counter()
        if self.rounds is not None:
            await self._sample_rounds(recorder, stats)
            return self._finish(recorder, stats, started)
        await self._refill(stats)
        progress = (0, time.monotonic())
        while True:
            progress = self._check_progress(stats, progress)
            up = self._up()
            acting = self.live & up
            if not acting.any():
                await self._refill(stats)
                continue
            idx = np.flatnonzero(acting)
            t0 = time.perf_counter()
            decision = self.runner.act(self.obs[idx])
            stats.inference_s += time.perf_counter() - t0
            row = recorder.add_row(acting, self.obs[idx], decision.actions, decision.logprobs, decision.values)
            t0 = time.perf_counter()
            result = await self.pool.step(self.slots[idx], decision.env_actions)
            stats.step_wall_s += time.perf_counter() - t0
            stats.step_server_s += result.server_s
            # Every slot of a server that is up holds its place in the lock-step row (padding
            # included); slots of a server that is down sample nothing and are not counted.
            stats.transitions += int(up.sum())

            self.apply_step(row, idx, result, decision.values, recorder, stats)
            if stats.valid >= self.samples_per_iteration:
                for s in np.flatnonzero(self.live):  # rollout boundary: bootstrap, keep the episode
                    recorder.truncate(row, int(s), next_obs=self.obs[s])
                break
            await self._refill(stats)
        return self._finish(recorder, stats, started)

    async def _sample_rounds(self, recorder: RolloutRecorder, stats: IterationStats) -> None:
        """Rounds until the iteration has its samples: each opened by a global reset, stepped
        (rounds.py) until the rule ends it, closed by a global truncation."""
        progress = (0, time.monotonic())
        while True:
            started, rows = time.perf_counter(), len(stats.row_steps)
            reset_s, inference_s = stats.reset_wall_s, stats.inference_s
            await self._start_round(stats)
            last_row = await self.rounds.step(self.rule, recorder, stats)
            self._end_round(last_row, recorder, stats)
            if len(stats.row_steps) > rows:  # an unpipelined round: the broker's own work outside its rows
                inside = stats.reset_wall_s - reset_s + stats.inference_s - inference_s
                inside += sum(w for _, w in stats.row_steps[rows:])
                stats.round_overheads.append(max(time.perf_counter() - started - inside, 0.0))
            if stats.valid >= self.samples_per_iteration:
                stats.running_lengths = self.episode_len[self.live].tolist()
                return
            progress = self._check_progress(stats, progress)

    def _check_progress(self, stats: IterationStats, progress: tuple[int, float]) -> tuple[int, float]:
        """(valid count, when it last grew); SamplingError when it has not grown for stall_timeout_s."""
        last_valid, last_progress = progress
        if stats.valid > last_valid:
            return stats.valid, time.monotonic()
        if time.monotonic() - last_progress > self.stall_timeout_s:
            raise SamplingError(
                f"no valid step for {self.stall_timeout_s:g} s; simulators: "
                + "; ".join(f"{s.address} up={s.up} {s.last_error}" for s in self.pool.servers)
            )
        return progress

    def apply_step(
        self,
        row: int,
        idx: np.ndarray,
        result: PoolStep,
        values: np.ndarray,
        recorder: RolloutRecorder,
        stats: IterationStats,
    ) -> np.ndarray:
        """A Step answer for slots `idx` (positions) at `row`: outcomes into the batch, failures
        padded, ended episodes recorded; returns the positions whose episode ended."""
        if result.failed.any():
            self._fault(row, idx, result.failed, values, recorder, stats)
        ok = ~result.failed
        done_idx = idx[ok]
        recorder.set_outcome(row, done_idx, result.rewards[ok], result.terminated[ok])
        stats.valid += done_idx.size
        self.episode_len[done_idx] += 1
        self.obs[done_idx] = result.observations[ok]
        ended_pos = np.flatnonzero(result.terminated[ok] | result.truncated[ok])
        for j in ended_pos:
            s = int(done_idx[j])
            terminated = bool(result.terminated[ok][j])
            if not terminated:
                recorder.truncate(row, s, next_obs=self.obs[s])
            summary = result.episodes.get(int(self.slots[s]))
            stats.record_episode(int(self.episode_len[s]), "terminated" if terminated else "clip_end", summary)
            self.live[s] = False
        return done_idx[ended_pos]

    def _finish(self, recorder: RolloutRecorder, stats: IterationStats, started: float):
        t0 = time.perf_counter()
        batch = recorder.build(self.runner.value)
        stats.inference_s += time.perf_counter() - t0
        stats.wall_s = time.perf_counter() - started
        return batch, stats

    def _fault(
        self,
        row: int,
        idx: np.ndarray,
        failed: np.ndarray,
        values: np.ndarray,
        recorder: RolloutRecorder,
        stats: IterationStats,
    ) -> None:
        """Slots whose server failed at this row: padding from here; their open previous step is bootstrapped."""
        for j in np.flatnonzero(failed):
            s = int(idx[j])
            recorder.invalidate(row, np.array([s]))
            if row > 0 and recorder.is_open(row - 1, s):
                # values[j] = V(obs the slot received after its previous step): the bootstrap value.
                recorder.truncate(row - 1, s, next_value=float(values[j]))
            if self.episode_len[s] > 0:
                stats.record_episode(int(self.episode_len[s]), "fault")
            self.live[s] = False
            if self.rounds is not None:
                self.rounds.mark_done(np.array([s]), row)
            stats.faults += 1

"""`ver`, variable experience rollout (as habitat-lab's): every slot runs on its own.

Each slot loops: infer, step, and on an episode's end reset, all without waiting for the
other slots. Inference is batched over whichever slots are waiting for an action at that
moment, and so are steps: the slots whose actions are ready step together, one Step call per
server (StepBatcher), as VER's implementations step the environments that are ready together;
a slot still waits only for its own server's answer.

The iteration has a fixed step budget that slots fill unevenly (fast slots take more of it).
Each slot's steps form one segment; segments are concatenated into a [L, 1] batch (every
segment ends terminated or truncated, so GAE never crosses segments), without padding. Live
episodes carry over to the next iteration, bootstrapped at the boundary.

Time split: VER has no single critical path, so stepping / resetting / inference-wait are
per-slot means (the sum over slots divided by N), and time efficiency is
sum(stepping) / sum(stepping + resetting) over slots (docs/metrics.md).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from broker.metrics import IterationStats
from broker.samplers.base import SamplingError

if TYPE_CHECKING:
    from broker.dealer import ClipDealer
    from broker.policy_runner import PolicyRunner
    from broker.slots import PoolStep, SlotPool


class InferenceBatcher:
    """Collects the slots waiting for an action and answers them with one forward pass."""

    def __init__(self, runner: PolicyRunner) -> None:
        self.runner = runner
        self._pending: list[tuple[np.ndarray, asyncio.Future]] = []
        self.busy_s = 0.0
        self.passes = 0

    def act(self, obs: np.ndarray) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self._pending:
            # Runs after every coroutine already runnable in this loop turn has queued its request.
            loop.call_soon(self._flush)
        self._pending.append((obs, future))
        return future

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        started = time.perf_counter()
        decision = self.runner.act(np.stack([obs for obs, _ in pending]))
        self.busy_s += time.perf_counter() - started
        self.passes += 1
        for j, (_, future) in enumerate(pending):
            if not future.cancelled():
                future.set_result(
                    (decision.actions[j], decision.env_actions[j], decision.logprobs[j], decision.values[j])
                )


class StepBatcher:
    """Steps the slots of a server that are ready together, in one unary Step call.

    A slot is *active* while it loops stepping (not while it resets, waits for budget or is
    done). A server's queued steps go out as one call as soon as every active slot of that
    server has queued one, so slots that share a server fall into step with each other (as VER's
    environments do around batched inference), or after `gather_s` at the latest, so a slot never
    waits long for one that is slow to come. Each slot's future resolves when its server answers.
    """

    def __init__(self, pool: SlotPool, gather_s: float = 0.002) -> None:
        self.pool = pool
        self.gather_s = gather_s
        self._pending: dict[int, list[tuple[int, np.ndarray, asyncio.Future]]] = {}
        self._active: dict[int, set[int]] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._calls: set[asyncio.Task] = set()
        self.calls = 0

    def _server(self, slot: int) -> int:
        return int(self.pool.slot_server[slot])

    def enter(self, slot: int) -> None:
        self._active.setdefault(self._server(slot), set()).add(slot)

    def leave(self, slot: int) -> None:
        server = self._server(slot)
        self._active.get(server, set()).discard(slot)
        self._flush_if_all_in(server)

    def step(self, slot: int, env_action: np.ndarray) -> asyncio.Future:
        """Global `slot`'s step with `env_action`: a future of (PoolStep of its call, its index there)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        server = self._server(slot)
        self.enter(slot)
        queue = self._pending.setdefault(server, [])
        queue.append((slot, env_action, future))
        if len(queue) == 1:
            self._timers[server] = loop.call_later(self.gather_s, self._flush, server)
        self._flush_if_all_in(server)
        return future

    def _flush_if_all_in(self, server: int) -> None:
        queue = self._pending.get(server)
        if queue and len(queue) >= len(self._active.get(server, ())):
            self._flush(server)

    def _flush(self, server: int) -> None:
        queue = self._pending.pop(server, [])
        timer = self._timers.pop(server, None)
        if timer is not None:
            timer.cancel()
        if not queue:
            return
        slots = np.array([slot for slot, _, _ in queue], dtype=np.int64)
        actions = np.stack([action for _, action, _ in queue])
        task = asyncio.ensure_future(self._call(slots, actions, [future for _, _, future in queue]))
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)
        self.calls += 1

    async def _call(self, slots: np.ndarray, actions: np.ndarray, futures: list[asyncio.Future]) -> None:
        try:
            result = await self.pool.step(slots, actions, unary=True)
        except BaseException as exc:  # the pool reports faults in the result; anything else reaches the slots
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for j, future in enumerate(futures):
            if not future.done():
                future.set_result((result, j))


@dataclass
class Segment:
    """One slot's steps in this iteration."""

    obs: list = field(default_factory=list)
    actions: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    values: list = field(default_factory=list)
    rewards: list = field(default_factory=list)
    terminated: list = field(default_factory=list)
    truncated: list = field(default_factory=list)
    bootstrap_obs: dict = field(default_factory=dict)  # step index -> obs to bootstrap from
    bootstrap_value: dict = field(default_factory=dict)  # step index -> known bootstrap value

    def record(self, obs, action, logprob, value, result: PoolStep, j: int) -> tuple[bool, bool]:
        """The step taken from `obs` (copied) with its answer, the `j`-th of `result`; (terminated, truncated)."""
        self.obs.append(obs.copy())
        self.actions.append(action)
        self.logprobs.append(logprob)
        self.values.append(value)
        self.rewards.append(float(result.rewards[j]))
        term, trunc = bool(result.terminated[j]), bool(result.truncated[j])
        self.terminated.append(term)
        self.truncated.append(trunc and not term)
        return term, trunc

    def open_last(self) -> bool:
        return bool(self.obs) and not self.terminated[-1] and not self.truncated[-1]


class VerSampler:
    def __init__(
        self,
        pool: SlotPool,
        runner: PolicyRunner,
        dealer: ClipDealer,
        *,
        samples_per_iteration: int,
        stall_timeout_s: float = 60.0,
        slots: np.ndarray | None = None,
        prefetch: bool = False,
        step_batching: bool = True,
    ) -> None:
        self.pool, self.runner, self.dealer = pool, runner, dealer
        self.prefetch = prefetch
        self.step_batching = step_batching  # False: one Step call per slot-step (before StepBatcher)
        self._next: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # prefetch: position -> (clip, seed) dealt ahead
        self.samples_per_iteration = samples_per_iteration
        self.stall_timeout_s = stall_timeout_s
        # Global ids of the slots this sampler drives; arrays below are indexed by position.
        self.slots = np.arange(pool.num_slots) if slots is None else np.asarray(slots, dtype=np.int64)
        n = self.slots.size
        space = pool.observation_space
        self.obs = np.zeros((n, *space.shape), dtype=space.dtype)
        self.live = np.zeros(n, dtype=bool)
        self.episode_len = np.zeros(n, dtype=np.int64)

    def apply_settings(self, *, samples_per_iteration: int, alpha: float, t_max: int) -> None:
        self.samples_per_iteration = samples_per_iteration  # VER has no rounds: alpha and t_max do not apply

    async def sample(self) -> tuple[dict[str, np.ndarray], IterationStats]:
        n = self.slots.size
        stats = IterationStats("ver", n)
        batcher = InferenceBatcher(self.runner)
        steps = StepBatcher(self.pool)
        # Every slot is about to step (one that must reset first leaves at once): without this the first
        # slot to ask would find itself its server's only active slot and step alone, and where a step
        # outlasts the gather window the split lasts, each half waiting the window for the other.
        for slot in self.slots.tolist():
            steps.enter(slot)
        segments = [Segment() for _ in range(n)]
        budget = [self.samples_per_iteration]
        step_s = np.zeros(n)
        step_server_s = np.zeros(n)
        reset_s = np.zeros(n)
        reset_server_s = np.zeros(n)
        started = time.perf_counter()

        async def ensure_live(s: int) -> bool:
            server = self.pool.servers[int(self.pool.slot_server[self.slots[s]])]
            deadline = time.monotonic() + self.stall_timeout_s
            while not self.live[s]:
                if not server.up:
                    if server.dropped or time.monotonic() > deadline:
                        return False
                    await self.pool.readmit_due()
                    if not server.up:
                        await asyncio.sleep(0.05)
                        continue
                here = self.pool.slot_server[self.slots[s : s + 1]]
                clips, seeds = self._next.pop(s, None) or self.dealer.deal(1, here)
                t0 = time.perf_counter()
                r = await self.pool.reset(self.slots[s : s + 1], clips, seeds, batched=False)
                reset_s[s] += time.perf_counter() - t0
                reset_server_s[s] += r.server_s
                stats.reset_calls += 1
                if not r.failed[0]:
                    self.obs[s], self.live[s], self.episode_len[s] = r.observations[0], True, 0
                    stats.slot_resets += 1
                    if self.prefetch:  # the slot's next clip loads while this episode runs
                        self._next[s] = self.dealer.deal(1, here)
                        await self.pool.prepare(self.slots[s : s + 1], *self._next[s])
            return True

        # Steps taken from the budget whose answer is not in yet: a failed one gives its sample back,
        # so a slot may stop only when the budget is spent and nothing is in flight.
        in_flight = [0]
        step_done = asyncio.Event()

        async def slot_loop(s: int) -> None:
            seg = segments[s]
            slot = int(self.slots[s])
            while True:
                if budget[0] <= 0:
                    steps.leave(slot)  # it steps no more: its server's other slots need not wait for it
                    if in_flight[0] == 0:
                        return
                    step_done.clear()
                    await step_done.wait()
                    continue
                if not self.live[s]:
                    steps.leave(slot)  # resetting: the others step without it meanwhile
                if not await ensure_live(s):
                    steps.leave(slot)
                    return  # its server stayed down: the other slots fill the budget
                if budget[0] <= 0:
                    continue
                budget[0] -= 1
                in_flight[0] += 1
                try:
                    action, env_action, logprob, value = await batcher.act(self.obs[s])
                    t0 = time.perf_counter()
                    if self.step_batching:
                        r, j = await steps.step(slot, env_action)
                    else:
                        r, j = await self.pool.step(self.slots[s : s + 1], env_action[None], unary=True), 0
                finally:
                    in_flight[0] -= 1
                    step_done.set()
                step_s[s] += time.perf_counter() - t0
                step_server_s[s] += r.server_s
                if r.failed[j]:
                    budget[0] += 1  # the lost step is not a sample
                    if seg.open_last():
                        seg.truncated[-1] = True
                        seg.bootstrap_value[len(seg.obs) - 1] = float(value)
                    if self.episode_len[s] > 0:
                        stats.record_episode(int(self.episode_len[s]), "fault")
                    self.live[s] = False
                    stats.faults += 1
                    continue
                term, trunc = seg.record(self.obs[s], action, logprob, value, r, j)
                self.episode_len[s] += 1
                self.obs[s] = r.observations[j]
                if term or trunc:
                    if not term:
                        seg.bootstrap_obs[len(seg.obs) - 1] = self.obs[s].copy()
                    stats.record_episode(
                        int(self.episode_len[s]),
                        "terminated" if term else "clip_end",
                        r.episodes.get(int(self.slots[s])),
                    )
                    self.live[s] = False

        await asyncio.gather(*(slot_loop(s) for s in range(n)))
        for s, seg in enumerate(segments):  # rollout boundary: bootstrap live episodes, keep them
            if seg.open_last():
                seg.truncated[-1] = True
                seg.bootstrap_obs[len(seg.obs) - 1] = self.obs[s].copy()
        total = sum(len(seg.obs) for seg in segments)
        if total == 0:
            raise SamplingError("VER collected no step: every simulator stayed down for the stall timeout")
        t0 = time.perf_counter()
        batch = self._concatenate(segments)
        stats.wall_s = time.perf_counter() - started
        stats.inference_s = batcher.busy_s + (time.perf_counter() - t0)
        stats.transitions = stats.valid = total
        stats.step_wall_s, stats.step_server_s = step_s.sum() / n, step_server_s.sum() / n
        stats.reset_wall_s, stats.reset_server_s = reset_s.sum() / n, reset_server_s.sum() / n
        return batch, stats

    def _concatenate(self, segments: list[Segment]) -> dict[str, np.ndarray]:
        space = self.pool.observation_space
        parts = [seg for seg in segments if seg.obs]
        batch = {
            "obs": np.concatenate([np.stack(seg.obs) for seg in parts]).astype(space.dtype, copy=False),
            "actions": np.concatenate([np.stack(seg.actions) for seg in parts]),
            "logprobs": np.concatenate([np.asarray(seg.logprobs, np.float32) for seg in parts]),
            "values": np.concatenate([np.asarray(seg.values, np.float32) for seg in parts]),
            "rewards": np.concatenate([np.asarray(seg.rewards, np.float32) for seg in parts]),
            "terminated": np.concatenate([np.asarray(seg.terminated, bool) for seg in parts]),
            "truncated": np.concatenate([np.asarray(seg.truncated, bool) for seg in parts]),
        }
        bootstrap = np.zeros(batch["rewards"].size, dtype=np.float32)
        offsets = np.cumsum([0] + [len(seg.obs) for seg in parts])
        at, obs = [], []
        for offset, seg in zip(offsets, parts):
            for i, o in seg.bootstrap_obs.items():
                at.append(offset + i)
                obs.append(o)
            for i, v in seg.bootstrap_value.items():
                bootstrap[offset + i] = v
        if at:
            bootstrap[np.array(at)] = self.runner.value(np.stack(obs))
        batch["bootstrap_values"] = bootstrap
        batch["valid_mask"] = np.ones(bootstrap.size, dtype=bool)
        # [L] -> [L, 1]: one long column; segment ends keep GAE from crossing segments.
        return {k: v.reshape(v.shape[0], 1, *v.shape[1:]) for k, v in batch.items()}

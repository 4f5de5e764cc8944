"""`ver`, variable experience rollout (as habitat-lab's): every slot runs on its own.

Each slot loops: infer, step, and on an episode's end reset, all without waiting for the
other slots. Inference is batched over whichever slots are waiting for an action at that
moment. The iteration has a fixed step budget that slots fill unevenly (fast slots take
more of it). Each slot's steps form one segment; segments are concatenated into a [L, 1]
batch (every segment ends terminated or truncated, so GAE never crosses segments), without
padding. Live episodes carry over to the next iteration, bootstrapped at the boundary.

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
    from broker.pool import SimulatorPool


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


@dataclass
class _Segment:
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

    def open_last(self) -> bool:
        return bool(self.obs) and not self.terminated[-1] and not self.truncated[-1]


class VerSampler:
    def __init__(
        self,
        pool: SimulatorPool,
        runner: PolicyRunner,
        dealer: ClipDealer,
        *,
        samples_per_iteration: int,
        stall_timeout_s: float = 60.0,
        slots: np.ndarray | None = None,
        prefetch: bool = False,
    ) -> None:
        self.pool, self.runner, self.dealer = pool, runner, dealer
        self.prefetch = prefetch
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
        segments = [_Segment() for _ in range(n)]
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
            while True:
                if budget[0] <= 0:
                    if in_flight[0] == 0:
                        return
                    step_done.clear()
                    await step_done.wait()
                    continue
                if not await ensure_live(s):
                    return  # its server stayed down: the other slots fill the budget
                if budget[0] <= 0:
                    continue
                budget[0] -= 1
                in_flight[0] += 1
                try:
                    action, env_action, logprob, value = await batcher.act(self.obs[s])
                    t0 = time.perf_counter()
                    r = await self.pool.step(self.slots[s : s + 1], env_action[None], unary=True)
                finally:
                    in_flight[0] -= 1
                    step_done.set()
                step_s[s] += time.perf_counter() - t0
                step_server_s[s] += r.server_s
                if r.failed[0]:
                    budget[0] += 1  # the lost step is not a sample
                    if seg.open_last():
                        seg.truncated[-1] = True
                        seg.bootstrap_value[len(seg.obs) - 1] = float(value)
                    if self.episode_len[s] > 0:
                        stats.record_episode(int(self.episode_len[s]), "fault")
                    self.live[s] = False
                    stats.faults += 1
                    continue
                seg.obs.append(self.obs[s].copy())
                seg.actions.append(action)
                seg.logprobs.append(logprob)
                seg.values.append(value)
                seg.rewards.append(float(r.rewards[0]))
                term, trunc = bool(r.terminated[0]), bool(r.truncated[0])
                seg.terminated.append(term)
                seg.truncated.append(trunc and not term)
                self.episode_len[s] += 1
                self.obs[s] = r.observations[0]
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

    def _concatenate(self, segments: list[_Segment]) -> dict[str, np.ndarray]:
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

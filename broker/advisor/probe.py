"""What the model needs of a simulator, measured from the broker's side through a SlotPool.

`probe_server` times calls to one server's slots, as the broker will make them, and reads off
the cost model's knobs (model.py `SimulatorCosts`) without being told them:

    step            one slot, then all its slots, per call: the server's answer says what it spent
                    (`server_s`), the rest of the wall time is the broker's part of a call (`call_s`)
    receive         one-slot Steps alone: the broker thread's CPU time of a call, and the share of it
                    after the answer woke the loop (wake.py), the receive that comes after the server's
    reset           one slot, then all its slots in one call, onto a clip whose map is loaded: the
                    fixed part and its per-slot part
    compute         of the timed Steps' and one-slot Resets' server time, the share the answers say
                    was the env's own compute (`compute_s`): it holds the server's one thread
    load            one slot onto a map it has not loaded: what the load adds
    engine          two one-slot resets at once (cached maps): one engine when the second waits out
                    the first's fixed part
    load channel    two one-slot resets at once onto new maps: shared when the loads add up
    steps stopped   a Step sent while a reset's fixed part runs: stopped when it waits for it
    Prepare         a slot's next clip prepared on a new map: hidden when its Reset then skips the
                    load; the penalty is what a Step of another slot costs more meanwhile

Each timed figure is kept with its median, mean and spread over `repeats`; the costs and the
findings read medians, as a burst of the machine's own load (another process on its cores) is an
outlier, not a cost of the simulator's. A yes/no finding is the hypothesis that predicts the
measured wall time closer; it needs the cost it looks for (a fixed part, a load) to be above the
timer's noise (NOISE_S) and maps the probe has not loaded yet (a catalog of few maps leaves the
last findings unmeasured), and reads no otherwise; the step penalty reads 0 below PENALTY_NOISE
(the median of three loads' ratios, after one to warm up). `probe_lengths` runs the autoreset
sampler for a while and returns the episode lengths, the episodes still running at its end
counted as cut (censored), for the Kaplan-Meier estimate (lengths.py).

The probe leaves the server's slots with live episodes of the clips it chose; a sampler that
starts after it resets them as usual.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass

import numpy as np

from broker.advisor.lengths import EpisodeLengths
from broker.advisor.model import SimulatorCosts
from broker.advisor.wake import LastWake
from broker.samplers import make_sampler
from fast.spaces import random_actions

# A cost counts as present when it exceeds this (seconds): below it the timer's and the event
# loop's noise decide, and the finding that needs it reads no.
NOISE_S = 0.001


# New maps the load's repeats leave for the findings after them: two for the load channel, four
# for Prepare (one warm-up and three measured loads).
SPARE_MAPS = 6
# A Step's extra time while a background load runs counts from this share on: below it, a loaded
# machine's own spread of step times decides.
PENALTY_NOISE = 0.2
# One-slot Steps timed for the split of a call's thread CPU (receive): about 1 ms each.
SPLIT_CALLS = 40
LENGTH_STEPS_PER_SLOT = 500  # steps each slot of the length probe plays at least (length_probe_slots)


class ProbeError(RuntimeError):
    """The probe could not measure: a call failed, or the server has no slot."""


@dataclass(frozen=True)
class Measured:
    median: float
    mean: float
    spread: float  # standard deviation over the repeats (0 for one)
    n: int

    @classmethod
    def of(cls, samples: list[float]) -> Measured:
        values = np.asarray(samples, dtype=float)
        spread = float(values.std(ddof=1)) if values.size > 1 else 0.0
        return cls(float(np.median(values)), float(values.mean()), spread, int(values.size))


@dataclass(frozen=True)
class ServerProbe:
    costs: SimulatorCosts
    call_s: float  # the broker's own part of a call (wall time beyond what the server spent)
    figures: dict[str, Measured]  # every timed figure, seconds, with its spread
    findings: dict[str, bool]  # reset_exclusive, loads_shared, reset_blocks_steps, prepare_hides_load

    @property
    def receive_share(self) -> float | None:
        """Of a call's thread CPU, the share after its answer came in (None where the loop cannot tell: wake.py)."""
        whole, received = self.figures.get("call_cpu"), self.figures.get("call_receive_cpu")
        if whole is None or received is None or not whole.median > 0:
            return None
        return min(received.median / whole.median, 1.0)


class _Prober:
    def __init__(self, pool, server: int, clip_map_ids: np.ndarray | None, seed: int) -> None:
        self.pool = pool
        self.slots = np.flatnonzero(np.asarray(pool.slot_server) == server)
        if self.slots.size == 0:
            raise ProbeError(f"server {server} has no slot to probe")
        maps = np.arange(pool.num_clips) if clip_map_ids is None else np.asarray(clip_map_ids)
        self.maps = maps
        self.used_maps: set[int] = set()
        self.rng = np.random.default_rng(seed)
        self.seeds = itertools.count(seed * 1_000_003)
        self.home = self.fresh_clip()
        if self.home is None:
            raise ProbeError("the catalog has no clip")
        self.last_compute_s = 0.0  # the last timed call's own compute, as its answer says

    def maps_left(self) -> int:
        return len(set(self.maps.tolist()) - self.used_maps)

    def fresh_clip(self) -> int | None:
        """A clip of a map the probe has not loaded yet (None when every map has been)."""
        for clip in range(self.maps.size):
            m = int(self.maps[clip])
            if m not in self.used_maps:
                self.used_maps.add(m)
                return clip
        return None

    async def reset(self, slots: np.ndarray, clip: int, *, batched: bool = True) -> float:
        clips = np.full(slots.size, clip, dtype=np.int64)
        seeds = np.array([next(self.seeds) for _ in range(slots.size)], dtype=np.int64)
        started = time.perf_counter()
        result = await self.pool.reset(slots, clips, seeds, batched=batched)
        wall = time.perf_counter() - started
        if result.failed.any():
            raise ProbeError(f"a Reset of slots {slots.tolist()} failed")
        self.last_compute_s = result.compute_s
        return wall

    async def thread_split(self, slots: np.ndarray, calls: int) -> tuple[list[float], list[float]]:
        """The broker thread's CPU time of `calls` Step calls of `slots`, one at a time, and of each the
        part after its answer woke the loop: ([], []) where the loop cannot tell (wake.py)."""
        whole, received = [], []
        with LastWake() as wake:
            if not wake.available:
                return [], []
            for _ in range(calls):
                actions = random_actions(self.pool.action_space, slots.size, self.rng)
                wake.clear()
                started = time.thread_time()
                result = await self.pool.step(slots, actions)
                ended = time.thread_time()
                if wake.cpu_s is not None:  # the answer came after a wait (a call never answered at once)
                    whole.append(ended - started)
                    received.append(ended - wake.cpu_s)
                await self._settle(slots, result)
        return whole, received

    async def step(self, slots: np.ndarray) -> tuple[float, float]:
        """(wall, server) seconds of one Step call; slots whose episode ended are reset (untimed)."""
        actions = random_actions(self.pool.action_space, slots.size, self.rng)
        started = time.perf_counter()
        result = await self.pool.step(slots, actions)
        wall = time.perf_counter() - started
        compute_s = result.compute_s  # read first: the resets of _settle set last_compute_s to theirs
        await self._settle(slots, result)
        self.last_compute_s = compute_s
        return wall, result.server_s

    async def _settle(self, slots: np.ndarray, result) -> None:
        """After a Step of `slots`: ProbeError if it failed; its slots whose episode ended reset (untimed)."""
        if result.failed.any():
            raise ProbeError(f"a Step of slots {slots.tolist()} failed")
        ended = slots[result.terminated | result.truncated]
        if ended.size:
            await self.reset(ended, self.home)


async def probe_server(pool, server: int, *, clip_map_ids=None, repeats: int = 5, seed: int = 0) -> ServerProbe:
    """Measure server `server` of `pool` (module docstring). `clip_map_ids`: each clip's map (a
    Describe's), so that "a new map" is one; without it each clip counts as a map of its own."""
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: give >= 1")
    p = _Prober(pool, server, clip_map_ids, seed)
    slots, one = p.slots, p.slots[:1]
    k = slots.size
    figures: dict[str, Measured] = {}
    await p.reset(slots, p.home)  # every slot live, the home map loaded

    walls, served, served_k, computed, step_shares = [], [], [], [], []
    for _ in range(repeats):
        wall, server_s = await p.step(one)
        walls.append(wall)
        served.append(server_s)
        computed.append(p.last_compute_s)
        step_shares.append(_share(p.last_compute_s, server_s))
        if k > 1:
            served_k.append((await p.step(slots))[1])
            computed.append(p.last_compute_s)
            step_shares.append(_share(p.last_compute_s, served_k[-1]))
    figures["step_1"] = Measured.of(served)
    figures["call"] = Measured.of([w - s for w, s in zip(walls, served)])
    call_s = max(figures["call"].median, 0.0)
    step_per_slot = 0.0
    if k > 1:
        figures[f"step_{k}"] = Measured.of(served_k)
        step_per_slot = _per_slot(served, served_k, k)
    step_s = max(figures["step_1"].median - step_per_slot, 0.0)
    whole, received = await p.thread_split(one, SPLIT_CALLS)
    if whole:
        figures["call_cpu"], figures["call_receive_cpu"] = Measured.of(whole), Measured.of(received)

    resets_1, reset_computed, reset_shares = [], [], []
    for _ in range(repeats):
        resets_1.append(await p.reset(one, p.home) - call_s)
        reset_computed.append(p.last_compute_s)
        reset_shares.append(_share(p.last_compute_s, resets_1[-1]))
    figures["reset_1"] = Measured.of(resets_1)
    figures["step_compute"], figures["reset_1_compute"] = Measured.of(computed), Measured.of(reset_computed)
    per_slot = 0.0
    if k > 1:
        resets_k = [await p.reset(slots, p.home) - call_s for _ in range(repeats)]
        figures[f"reset_{k}"] = Measured.of(resets_k)
        per_slot = _per_slot(resets_1, resets_k, k)
    one_reset = max(figures["reset_1"].median, 0.0)  # fixed part and one slot's share
    fixed = max(one_reset - per_slot, 0.0)
    # Per call, then the median: a call the machine slowed is an outlier of its share too.
    step_compute_share, reset_compute_share = float(np.median(step_shares)), float(np.median(reset_shares))

    loads = []
    for j in range(repeats):
        clip = p.fresh_clip() if j == 0 or p.maps_left() > SPARE_MAPS else None
        if clip is None:
            break
        loads.append(await p.reset(one, clip) - call_s - one_reset)
    load = max(float(np.median(loads)), 0.0) if loads else 0.0
    if loads:
        figures["load"] = Measured.of(loads)
    await p.reset(slots, p.home)

    findings = {"reset_exclusive": False, "loads_shared": False, "reset_blocks_steps": False}
    if k > 1 and one_reset > NOISE_S:
        pair = slots[:2]
        both = [await p.reset(pair, p.home, batched=False) - call_s for _ in range(repeats)]
        figures["reset_1_twice_at_once"] = Measured.of(both)
        # one engine: the second fixed part waits for the first (2F); else they overlap (F)
        f, pair_wall = float(np.median(resets_1)), float(np.median(both))  # medians: bursts of load are outliers
        findings["reset_exclusive"] = bool(abs(pair_wall - 2 * f) < abs(pair_wall - f))
    if k > 1 and load > NOISE_S:
        first, second = p.fresh_clip(), p.fresh_clip()
        if first is not None and second is not None:
            pair = slots[:2]
            clips = np.array([first, second])
            seeds = np.array([next(p.seeds), next(p.seeds)])
            started = time.perf_counter()
            result = await pool.reset(pair, clips, seeds, batched=False)
            wall = time.perf_counter() - started - call_s
            if result.failed.any():
                raise ProbeError(f"a Reset of slots {pair.tolist()} failed")
            figures["load_twice_at_once"] = Measured.of([wall])
            f = float(np.median(resets_1))
            fixed_end = 2 * f if findings["reset_exclusive"] else f  # when the second fixed part ends
            shared = max(fixed_end, f + load) + load  # the second load waits for the first
            separate = fixed_end + load
            findings["loads_shared"] = bool(abs(wall - shared) < abs(wall - separate))
            await p.reset(slots, p.home)
    if k > 1 and fixed > NOISE_S:
        other = slots[1:2]
        plain = float(np.median(served))

        async def step_later() -> float:
            await asyncio.sleep(call_s + 0.2 * fixed)  # once the fixed part runs
            return (await p.step(other))[0]

        waited = []
        for _ in range(max(2, repeats // 2)):
            _, wall = await asyncio.gather(p.reset(one, p.home), step_later())
            waited.append(wall - call_s)
        figures["step_during_reset"] = Measured.of(waited)
        # stopped: the Step waits out the rest of the fixed part (about 0.8 F) before its own time
        late = float(np.median(waited))
        findings["reset_blocks_steps"] = bool(abs(late - (plain + 0.8 * fixed)) < abs(late - plain))

    prepare, penalty = False, 0.0

    async def steps_for(seconds: float) -> list[float]:
        """The server's time of each Step of another slot than the prepared one, for `seconds`."""
        began, spent = time.perf_counter(), []
        while k > 1 and time.perf_counter() - began < seconds:
            spent.append((await p.step(slots[1:2]))[1])
        return spent

    before, during, prepared, ratios = [], [], [], []
    for attempt in range(4 if load > NOISE_S else 0):
        clip = p.fresh_clip()
        if clip is None:
            break
        seed_ = next(p.seeds)
        plain = await steps_for(0.7 * load)  # the same Steps without a load, just before
        await pool.prepare(one, np.array([clip]), np.array([seed_]))
        started = time.perf_counter()
        loading = await steps_for(0.7 * load)
        if plain and loading and attempt > 0:  # the first runs slow here and there: a warm-up
            # Medians: a loaded machine's late wake-ups are outliers of either list.
            ratios.append(float(np.median(loading)) / float(np.median(plain)) - 1.0)
        before, during = before + plain, during + loading
        await asyncio.sleep(max(load * 1.2 - (time.perf_counter() - started), 0.0))
        t0 = time.perf_counter()
        result = await pool.reset(one, np.array([clip]), np.array([seed_]), batched=False)
        if result.failed.any():
            raise ProbeError(f"a Reset of slot {int(one[0])} failed")
        prepared.append(time.perf_counter() - t0 - call_s)
    if prepared:
        figures["reset_1_prepared"] = Measured.of(prepared)
        after = float(np.median(prepared))
        prepare = bool(abs(after - one_reset) < abs(after - (one_reset + load)))
    if ratios:
        figures["step_1_before_loading"] = Measured.of(before)
        figures["step_1_while_loading"] = Measured.of(during)
        ratio = float(np.median(ratios))  # of three loads: a burst of the machine's load skews one
        penalty = ratio if ratio > PENALTY_NOISE else 0.0
    findings["prepare_hides_load"] = prepare
    costs = SimulatorCosts(
        step_s=step_s,
        step_per_slot_s=step_per_slot,
        reset_fixed_s=fixed,
        reset_per_slot_s=per_slot,
        reset_exclusive=findings["reset_exclusive"],
        reset_blocks_steps=findings["reset_blocks_steps"],
        map_load_s=load,
        loads_shared=findings["loads_shared"],
        prepare=prepare,
        prefetch_step_penalty=penalty,
        step_compute_share=step_compute_share,
        reset_compute_share=reset_compute_share,
    )
    return ServerProbe(costs, call_s, figures, findings)


def _share(part: float, whole: float) -> float:
    """`part` of `whole` as a share in [0, 1]; 0 when there is no whole to share."""
    return min(max(part / whole, 0.0), 1.0) if whole > 0 else 0.0


def _per_slot(one: list[float], many: list[float], k: int) -> float:
    """What each slot beyond the first adds to a call, from calls of 1 and of k slots: medians (a
    loaded machine's late wake-ups are outliers), and 0 unless the difference is above the noise."""
    extra = float(np.median(many)) - float(np.median(one))
    return extra / (k - 1) if extra > NOISE_S else 0.0


def length_probe_slots(slots: np.ndarray, samples: int) -> np.ndarray:
    """The slots a length probe of `samples` steps runs on: at most samples // LENGTH_STEPS_PER_SLOT
    of `slots`, evenly spaced (so every server keeps some), at least one.

    The lengths do not depend on how many slots play them, but their estimate does: each slot ends
    the probe with one episode cut at its length so far, and with many slots those cuts come early.
    2,000 steps over 30 slots cut every episode of the trained policy at 67 steps, the estimate put
    them all there (the longest observation is where a censored tail's mass goes), and the model
    charged VER and autoreset a reset every 67 steps: 1.5 to 2.2x too slow (benchmarks/results/
    advisor-ranking/all-presets). The probe's wall time hardly changes: resets, one per episode,
    dominate it, and the episodes are the same in number.
    """
    count = min(slots.size, max(1, samples // LENGTH_STEPS_PER_SLOT))
    return slots[np.unique(np.linspace(0, slots.size - 1, count).round().astype(np.int64))]


async def probe_lengths(
    pool, runner, dealer, *, samples: int, slots: np.ndarray | None = None, prefetch: bool = False
) -> EpisodeLengths:
    """The episode lengths of `runner`'s policy: `samples` valid steps of the autoreset sampler over
    `slots`; the episodes still running at the end count as cut at their length so far (pass
    `length_probe_slots` for slots a sample of this size leaves long enough to end theirs). `prefetch`
    (when the slots' servers serve Prepare) loads each slot's next map during its episode: the same
    sample, as autoreset steps every slot every row whatever its resets cost, sooner."""
    sampler = make_sampler(
        "autoreset", pool, runner, dealer, samples_per_iteration=samples, slots=slots, prefetch=prefetch
    )
    _, stats = await sampler.sample()
    running = sampler.episode_len[sampler.live & (sampler.episode_len > 0)]
    lengths = np.concatenate([np.asarray(stats.episode_lengths, dtype=np.int64), running.astype(np.int64)])
    censored = np.concatenate([np.zeros(len(stats.episode_lengths), bool), np.ones(running.size, bool)])
    return EpisodeLengths.from_sample(lengths, censored)

"""`fast advise`: measure the simulators, predict every sampling mode, validate the best two.

    1. servers    the built-in takeover servers under a preset (started and stopped here, as
                  `fast bench sampling` starts them), or external ones (`--simulators`)
    2. probe      each server's costs and findings through the broker's own pool
                  (broker/advisor/probe.py `probe_server`), the forward pass's time, and the
                  episode lengths under the policy (`probe_lengths`, Kaplan-Meier)
    3. predict    the Workload those make; FAST's alpha by `best_alpha` (carry); then every mode,
                  with and without prefetch and locality where the servers offer them, by `rank`
                  (broker/advisor/model.py); each mode's best variant is its row
    4. validate   the best `validate_top` rows run briefly with the real samplers, as `fast bench
                  sampling` measures a configuration (jobs/bench/harness.py `measure_mode`: a
                  warm-up iteration, then `iterations` measured ones, as the model plays them);
                  measured beside predicted; the recommendation is the model's first unless a
                  validated row measured faster past --mode auto's margin (jobs/advise/choice.py)

`advise_on` is steps 2 and 3 on a pool that runs already, for one policy and clip count, and
`measure_row` one row's run of step 4 (`run_row` the same unsummarised, so that several sum into
one figure): benchmarks/advisor_ranking.py runs `advise_on` and `run_row`, for every mode.
The result is one dict (what `--json` writes); jobs/advise/report.py prints it.
"""

from __future__ import annotations

import asyncio
import math
import platform
import time
from dataclasses import asdict, dataclass, replace

import numpy as np

from broker.advisor.model import (
    Catalog,
    Horizon,
    Prediction,
    SimulatorCosts,
    Workload,
    best_alpha,
    rank,
    standard_modes,
)
from broker.advisor.probe import ProbeError, ServerProbe, length_probe_slots, probe_lengths, probe_server
from broker.advisor.records import inputs_record
from broker.dealer import HOLDOUT_EVERY, ClipDealer
from broker.recorder import RolloutRecorder
from broker.samplers.ver import InferenceBatcher, Segment, StepBatcher
from jobs.advise.choice import choose
from jobs.advise.config import DEFAULT_CLIPS, AdviseConfig
from jobs.bench.config import EXTERNAL, MODES, SamplingBenchConfig
from jobs.bench.harness import (
    ModeRun,
    fixed_policies,
    run_mode,
    runner_for,
    runs_summary,
    simulator_pool,
    spread_slots,
)
from jobs.bench.limits import Costs, Pattern, pattern_limit
from jobs.external import ExternalSimulators, check_simulators

# Lock-step rows, and rows of VER's slot loops, timed for the broker's own part of a row (`_RowClock`),
# this many of each. 200: the median of 40 moved from 0.63 to 1.04 ms between back-to-back probes of
# one quiet pool (`off`, 10 clips), that of 200 from 0.65 to 0.83; under `off` that figure is most of a
# mode's time. About 1 s more under `off`, 2 to 3 s under the costly presets.
ROWS = 200
# ... in this many blocks, lock-step and VER rows alternating, half of them before the length probe
# and half after it, and each figure the median of the blocks' means (`_RowClock`).
ROW_BLOCKS = 8
# Forward passes timed per batch size for the model's inference cost (medians: a loaded machine's
# late wake-ups are outliers).
INFERENCE_CALLS = 50


def bench_config(cfg: AdviseConfig, clips: int) -> SamplingBenchConfig:
    """The `fast bench sampling` settings of the validation runs (and of the servers it starts)."""
    return SamplingBenchConfig(
        modes=MODES,
        clips=(clips,),
        presets=(EXTERNAL,) if cfg.simulators else (cfg.preset,),
        servers=cfg.servers,
        samples=cfg.samples_for(clips),
        warmup_steps=cfg.warmup_steps,
        t_max=cfg.t_max,
        seed=cfg.seed,
        checkpoint_dir=cfg.checkpoint,
        gym_reference=False,
        length_samples=0,
        simulators=tuple(cfg.simulators),
        prefetch_step_penalties=(0.0,),
    )


def run(cfg: AdviseConfig, log=print) -> dict:
    """Everything `fast advise` measures, predicts and validates, as one dict (module docstring)."""
    started = time.perf_counter()
    external = check_simulators(cfg.simulators) if cfg.simulators else None  # before anything starts
    if external is not None:
        log(f"on {external.describe()}")
    clips = cfg.clips or (external.num_slots if external is not None else DEFAULT_CLIPS)
    if external is not None and clips > external.num_slots:
        raise ValueError(f"--clips {clips}: the simulators have {external.num_slots} slots; give --clips <= that")
    try:
        result = asyncio.run(_advise(cfg, clips, external, log))
    except ProbeError as exc:
        raise RuntimeError(f"the probe could not measure: {exc}") from None
    result["wall_s"] = time.perf_counter() - started
    return result


async def _advise(cfg: AdviseConfig, clips: int, external: ExternalSimulators | None, log) -> dict:
    bench = bench_config(cfg, clips)
    preset = EXTERNAL if external is not None else cfg.preset
    async with simulator_pool(bench, preset, external) as pool:
        policies = fixed_policies(bench, pool)
        policy = "trained" if "trained" in policies else "random"
        hidden, weights = policies[policy]
        advice = await advise_on(cfg, pool, clips, policy, hidden, weights, log)
        workload = advice.workload

        t0 = time.perf_counter()
        validation = []
        for row in advice.rows[: cfg.validate_top]:
            log(
                f"validating {row['label']} ({cfg.iterations} x {cfg.samples_for(clips)} valid transitions "
                "after a warm-up) ..."
            )
            summary = await measure_row(
                cfg, bench, pool, runner_for(pool, hidden, weights, cfg.seed), row, clips, cfg.seed
            )
            measured = float(summary["effective_throughput"])
            validation.append(
                {
                    "label": row["label"],
                    "predicted_effective_throughput": row["effective_throughput"],
                    "measured_effective_throughput": measured,
                    "ratio": measured / row["effective_throughput"] if row["effective_throughput"] > 0 else math.nan,
                    "predicted_eta": row["eta"],
                    "measured_eta": float(summary["validity"]),
                    "predicted_slot_resets_per_1k_valid": row["slot_resets_per_1k_valid"],
                    "measured_slot_resets_per_1k_valid": float(summary["slot_resets_per_1k_valid"]),
                    "measured": summary,
                }
            )
        validate_s = time.perf_counter() - t0

        choice = choose(advice.rows, validation)
        best = choice.row
        return {
            "config": cfg.model_dump(mode="json"),
            "workload": {
                "simulators": external.record() if external is not None else {"preset": cfg.preset},
                "servers": [pool.servers[i].address for i in advice.used],
                "clips": clips,
                "slots_per_server": workload.slots_per_server,
                "policy": policy,
                "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
            },
            "probes": {
                str(i): {
                    "costs": asdict(workload.server_costs(j)),
                    "call_s": advice.probes[i].call_s,
                    "receive_share": advice.probes[i].receive_share,
                    "findings": advice.probes[i].findings,
                    "figures": {name: asdict(m) for name, m in advice.probes[i].figures.items()},
                }
                for j, i in enumerate(advice.used)
            },
            "inference": advice.inference,
            "call_s": {"one_call": advice.one_call_s, "row": advice.row.broker_s, "used": workload.call_s},
            "row_server_s": advice.row.server_s,
            "row_cpu_s": advice.row.cpu_s,
            "call_receive_cpu_s": advice.call_receive_cpu_s,
            "ver": {"row_s": advice.ver_row_s, "slot_s": workload.ver_slot_s},
            "episode_lengths": _lengths_record(workload.lengths),
            # What the model ran on, whole: `broker.advisor.records.workload_from_record` reads it back.
            "model_inputs": inputs_record(workload, advice.horizon, seed=cfg.seed, seeds=cfg.model_seeds),
            "alpha": {
                "best": advice.alpha,
                "grid": [
                    {"alpha": p.settings.alpha, "effective_throughput": p.effective_throughput} for p in advice.grid
                ],
            },
            "ranking": advice.rows,
            "predictions": advice.predictions,
            "recommended": {
                "mode": best["settings"]["mode"],
                "label": best["label"],
                "alpha": best["settings"]["alpha"] if best["settings"]["mode"] == "fast" else None,
                "truncation": best["settings"]["truncation"] if best["settings"]["mode"] == "fast" else None,
                "t_max": cfg.t_max if best["settings"]["mode"] == "fast" else None,
                "prefetch": best["settings"]["prefetch"],
                "locality": best["settings"]["locality"],
                "by": choice.by,
                "reason": choice.reason,
            },
            "validation": validation,
            "timings_s": {**advice.timings_s, "validate": validate_s},
        }


@dataclass
class Advice:
    """What the probe measured and the model predicted on one pool, for one policy and clip count
    (steps 2 and 3 of the module docstring)."""

    used: list[int]  # the servers the clips spread over
    probes: dict[int, ServerProbe]  # per server used
    inference: dict  # `_time_inference`'s
    one_call_s: float  # the probes' median call alone
    call_receive_cpu_s: float | None  # of call_cpu_s, the part after the answer (measured; not modelled)
    row: RowTiming  # a lock-step row's broker part and server time (`_RowClock`)
    ver_row_s: float  # the broker's part of a row of VER's slot loops (`_RowClock`)
    workload: Workload
    horizon: Horizon  # what the model ran: the warm-up and measured iterations
    alpha: float  # FAST's, by `best_alpha`
    grid: list[Prediction]  # `best_alpha`'s predictions, one per alpha
    rows: list[dict]  # a row per mode, its best variant, best first (`_row`)
    predictions: list[dict]  # every variant, best first (`_row`)
    timings_s: dict  # probe, lengths, predict


async def advise_on(
    cfg: AdviseConfig, pool, clips: int, policy: str, hidden: tuple[int, ...], weights: bytes | None, log=print
) -> Advice:
    """Probe `pool`'s servers that `clips` slots spread over, and the episode lengths under `policy`
    (its `hidden` sizes and `weights`; None: the initial network), then predict every mode on them."""
    slots = spread_slots(pool, clips)
    used = [int(s) for s in np.unique(pool.slot_server[slots])]
    maps = pool.clip_map_ids if pool.clip_map_ids.size == pool.num_clips else None
    t0 = time.perf_counter()
    probes = {}
    for i in used:
        log(f"probing server {i} ({pool.servers[i].address}) ...")
        probes[i] = await probe_server(pool, i, clip_map_ids=maps, repeats=cfg.probe_repeats, seed=cfg.seed + i)
    inference = _time_inference(runner_for(pool, hidden, weights, cfg.seed), pool, math.ceil(clips / len(used)))
    one_call_s = float(np.median([probes[i].call_s for i in used]))
    clock = _RowClock(pool, runner_for(pool, hidden, weights, cfg.seed), slots, inference, cfg.seed)
    await clock.time(ROW_BLOCKS // 2)
    probe_s = time.perf_counter() - t0  # the servers, the forward pass and the rows (with the rest below)

    t0 = time.perf_counter()
    probed = length_probe_slots(slots, cfg.length_samples)
    log(
        f"probing episode lengths under the {policy} policy ({cfg.length_samples} valid transitions "
        f"over {probed.size} slot(s)) ..."
    )
    dealer = ClipDealer(pool.num_clips, holdout_every=HOLDOUT_EVERY, seed=cfg.seed)
    runner = runner_for(pool, hidden, weights, cfg.seed)
    prefetch = all(pool.servers[i].prefetch for i in used)  # every server used serves Prepare
    lengths = await probe_lengths(pool, runner, dealer, samples=cfg.length_samples, slots=probed, prefetch=prefetch)
    lengths_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    await clock.time(ROW_BLOCKS - ROW_BLOCKS // 2, fresh=True)  # seconds after the first half
    row, ver_row_s = clock.timing()
    probe_s += time.perf_counter() - t0

    costs = []
    per_server = math.ceil(clips / len(used))
    call_s = max(one_call_s, row.broker_s)
    shares = [probes[i].receive_share for i in used if probes[i].receive_share is not None]
    # A call's receive, measured and recorded, not given to the model: played, it moved VER up 0.05 to
    # 0.15 of measured / predicted in every configuration of all-presets-v12 and scored worse (the lone
    # call it implies costs more than the probe's one call alone measures; docs/advisor.md).
    receive_cpu_s = float(np.median(shares)) * row.cpu_s / len(used) if shares else None
    for i in used:
        described = pool.servers[i].cost_model  # the map cache's size is not probed: Describe says it
        cache = {"map_cache_size": int(described.map_cache_size)} if described is not None else {}
        costs.append(replace(probes[i].costs, **cache, step_per_slot_s=_row_slope(probes[i].costs, row, per_server)))
    workload = Workload(
        lengths,
        tuple(costs),
        servers=len(used),
        slots_per_server=per_server,
        inference_s=inference["inference_s"],
        inference_per_obs_s=inference["inference_per_obs_s"],
        call_s=call_s,
        # Of it, each of the row's calls holds the broker's thread for its share of the row's CPU time
        # (RowTiming caps that at the row's part, and call_s is at least the row's part).
        call_cpu_s=row.cpu_s / len(used),
        # What a VER row costs the broker beyond the one call's transport the model charges it anyway,
        # shared by its slot-steps.
        ver_slot_s=max(ver_row_s - call_s, 0.0) / slots.size,
        catalog=Catalog(maps, holdout_every=HOLDOUT_EVERY) if maps is not None else None,
    )
    horizon = Horizon(
        samples_per_iteration=cfg.samples_for(clips),
        iterations=cfg.iterations,
        warmup_iterations=1,
        warmup_samples=max(cfg.warmup_steps * clips, 1),
    )
    t0 = time.perf_counter()
    log("predicting every mode ...")
    alpha, grid = best_alpha(workload, t_max=cfg.t_max, horizon=horizon, seed=cfg.seed, seeds=cfg.model_seeds)
    prefetches = (False, True) if prefetch else (False,)
    localities = (False, True) if maps is not None else (False,)
    candidates = [
        settings
        for prefetch in prefetches
        for locality in localities
        for settings in standard_modes(alpha=alpha, t_max=cfg.t_max, prefetch=prefetch, locality=locality)
    ]
    ranked = rank(workload, candidates, horizon, seed=cfg.seed, seeds=cfg.model_seeds)
    predict_s = time.perf_counter() - t0
    limit_costs = _limit_costs(costs[0])
    rows, seen = [], set()
    for p in ranked:  # best first: a mode's first prediction is its best variant
        base = (p.settings.mode, p.settings.truncation if p.settings.mode == "fast" else "")
        if base not in seen:
            seen.add(base)
            rows.append(_row(p, workload, limit_costs))
    return Advice(
        used=used,
        probes=probes,
        inference=inference,
        one_call_s=one_call_s,
        call_receive_cpu_s=receive_cpu_s,
        row=row,
        ver_row_s=ver_row_s,
        workload=workload,
        horizon=horizon,
        alpha=alpha,
        grid=grid,
        rows=rows,
        predictions=[_row(p, workload, limit_costs) for p in ranked],
        timings_s={"probe": probe_s, "lengths": lengths_s, "predict": predict_s},
    )


async def measure_row(
    cfg: AdviseConfig, bench: SamplingBenchConfig, pool, runner, row: dict, clips: int, seed: int
) -> dict:
    """One row's variant (mode, alpha, truncation, prefetch, locality) run with the real sampler on
    `clips` slots, as `fast bench sampling` measures a configuration (`measure_mode`: a warm-up
    iteration of `warmup_steps` per clip, then `iterations` of `samples`); their summary as one."""
    return runs_summary([await run_row(cfg, bench, pool, runner, row, clips, seed)], pool)


async def run_row(
    cfg: AdviseConfig, bench: SamplingBenchConfig, pool, runner, row: dict, clips: int, seed: int, iterations=None
) -> ModeRun:
    """`measure_row`'s run, unsummarised (`runs_summary` sums several); `iterations` in place of cfg's."""
    s = row["settings"]
    return await run_mode(
        replace(bench, alpha=s["alpha"]),
        pool,
        runner,
        s["mode"],
        clips,
        seed,
        warmup_samples=max(cfg.warmup_steps * clips, 1),
        samples=cfg.samples_for(clips),
        locality=s["locality"],
        prefetch=s["prefetch"],
        truncation=s["truncation"],
        iterations=iterations or cfg.iterations,
    )


def _time_inference(runner, pool, batch: int) -> dict:
    """The forward pass's time for one observation and for a server's `batch`: what the model charges
    the broker's thread (`inference_s + batch * inference_per_obs_s`)."""
    shape = tuple(pool.observation_space.shape)

    def median_s(k: int) -> float:
        obs = np.zeros((k, *shape), dtype=np.float32)
        runner.act(obs)  # a first call warms the caches up
        times = []
        for _ in range(INFERENCE_CALLS):
            t = time.perf_counter()
            runner.act(obs)
            times.append(time.perf_counter() - t)
        return float(np.median(times))

    one = median_s(1)
    per_obs = max(median_s(batch) - one, 0.0) / (batch - 1) if batch > 1 else 0.0
    return {"inference_s": max(one - per_obs, 0.0), "inference_per_obs_s": per_obs, "batch": batch}


@dataclass(frozen=True)
class RowTiming:
    """The broker's part of a row and the server time it waited for, each the median over blocks of
    rows of a block's mean: a sampler's throughput pays the mean, a machine's late wake-ups and all
    (the rows' medians were 0.06 to 0.11 ms below it on a quiet `off` pool of 30 clips), while a block
    the machine's pace slowed as a whole (twice the others' in a probe of all-presets-v16) is an
    outlier of the blocks (docs/advisor.md)."""

    broker_s: float  # wall less the slowest server's time and the forward passes' modelled time
    server_s: float  # the slowest server's own time (the row waits for it)
    # Of broker_s, the broker thread's CPU time (time.thread_time; grpc.aio works on the loop's thread):
    # the work no other of its work can overlap, where the rest is a wait (the model's `call_cpu_s`).
    cpu_s: float = 0.0


class _LockstepRows:
    """Lock-step rows as the rounds make them (broker/samplers/rounds.py): a forward pass per server,
    each server's slots recorded into the batch (broker/recorder.py, as the lock-step loop records
    them), one Step call per server at once, the outcomes recorded. `probe_server`'s `call_s` is one
    call's alone; a row of several servers' calls from one event loop costs the broker more, and so
    does recording its slots (docs/advisor.md)."""

    def __init__(self, pool, runner, slots: np.ndarray, inference: dict, seed: int) -> None:
        self.pool, self.runner, self.slots = pool, runner, slots
        self.groups = [np.flatnonzero(pool.slot_server[slots] == s) for s in np.unique(pool.slot_server[slots])]
        # The forward passes' modelled time, one a server, not the broker's part of the row.
        self.modelled = sum(inference["inference_s"] + g.size * inference["inference_per_obs_s"] for g in self.groups)
        self.obs = np.zeros((slots.size, *pool.observation_space.shape), dtype=np.float32)
        self.recorder = RolloutRecorder.for_spaces(slots.size, pool.observation_space, pool.action_space)
        self.seeds = iter(range(seed * 1_000_003 + 500_000, seed * 1_000_003 + 600_000))
        self.blocks: list[tuple[float, float, float]] = []  # per block, the means of (extra, served, cpu)

    async def time(self, rows: int) -> None:
        """One block of `rows` rows."""
        pool, slots, groups = self.pool, self.slots, self.groups
        extra, served, cpus = [], [], []
        for _ in range(rows):
            started, cpu_started = time.perf_counter(), time.thread_time()
            row = self.recorder.new_row()
            actions = []
            for group in groups:
                decision = self.runner.act(self.obs[group])
                self.recorder.put(row, group, self.obs[group], decision.actions, decision.logprobs, decision.values)
                actions.append(decision.env_actions)
            result = await pool.step(slots, np.concatenate(actions))
            if result.failed.any():
                raise ProbeError(f"a Step of slots {slots.tolist()} failed")
            self.recorder.set_outcome(row, np.arange(slots.size), result.rewards, result.terminated)
            wall, cpu = time.perf_counter() - started, time.thread_time() - cpu_started
            extra.append(wall - result.server_s - self.modelled)
            served.append(result.server_s)
            cpus.append(cpu - self.modelled)
            self.obs = result.observations.astype(np.float32, copy=False)
            await _reset_ended(pool, slots[result.terminated | result.truncated], self.seeds)
        self.blocks.append((float(np.mean(extra)), float(np.mean(served)), float(np.mean(cpus))))

    def timing(self) -> RowTiming:
        extra, served, cpu = np.median(np.asarray(self.blocks), axis=0)
        broker_s = max(float(extra), 0.0)
        return RowTiming(broker_s, float(served), min(max(float(cpu), 0.0), broker_s))


class _VerRows:
    """Rows of VER's slot loops: every slot asks for its action and its step from a coroutine of its
    own, through ver.py's InferenceBatcher and StepBatcher (one forward pass, one unary Step call per
    server), and appends its step to its segment as ver.py does. Their broker part (the wall less the
    slowest server's time and the pass's modelled time) against `_LockstepRows`' is what VER's per-slot
    coroutines and futures cost where a lock-step loop handles the row as one array."""

    def __init__(self, pool, runner, slots: np.ndarray, inference: dict, seed: int) -> None:
        self.pool, self.slots = pool, slots
        self.modelled = inference["inference_s"] + slots.size * inference["inference_per_obs_s"]  # one pass
        self.actions, self.steps = InferenceBatcher(runner), StepBatcher(pool)
        self.obs = np.zeros((slots.size, *pool.observation_space.shape), dtype=np.float32)
        self.segments = [Segment() for _ in range(slots.size)]
        self.seeds = iter(range(seed * 1_000_003 + 600_000, seed * 1_000_003 + 700_000))
        self.blocks: list[float] = []  # per block, the mean broker part of its rows

    async def _slot_step(self, i: int):
        action, env_action, logprob, value = await self.actions.act(self.obs[i])
        result, j = await self.steps.step(int(self.slots[i]), env_action)
        if not result.failed[j]:
            self.segments[i].record(self.obs[i], action, logprob, value, result, j)
        return result, j

    async def time(self, rows: int) -> None:
        """One block of `rows` rows."""
        slots = self.slots
        extra = []
        for _ in range(rows):
            started = time.perf_counter()
            answers = await asyncio.gather(*(self._slot_step(i) for i in range(slots.size)))
            wall = time.perf_counter() - started
            calls = {id(result): result for result, _ in answers}.values()
            if any(result.failed.any() for result in calls):
                raise ProbeError(f"a Step of slots {slots.tolist()} failed")
            extra.append(wall - max(result.server_s for result in calls) - self.modelled)
            self.obs = np.stack([result.observations[j] for result, j in answers]).astype(np.float32, copy=False)
            done = np.array([bool(result.terminated[j] or result.truncated[j]) for result, j in answers])
            await _reset_ended(self.pool, slots[done], self.seeds)
        self.blocks.append(float(np.mean(extra)))

    def broker_s(self) -> float:
        return max(float(np.median(self.blocks)), 0.0)


async def _reset_ended(pool, ended: np.ndarray, seeds) -> None:
    """Untimed: the ended slots onto the same clip again, whose map the server has cached."""
    if ended.size:
        clips = np.zeros(ended.size, dtype=np.int64)
        await pool.reset(ended, clips, np.array([next(seeds) for _ in ended], dtype=np.int64), batched=True)


class _RowClock:
    """Lock-step rows and rows of VER's slot loops, timed in blocks of ROWS // ROW_BLOCKS of each,
    alternating: VER's own work per slot-step is the difference of the two, and this machine's pace
    moves by 30% between blocks of a second (docs/advisor.md): timed apart, the two saw different
    paces and the difference was as much the machine's as VER's. `advise_on` times half the blocks
    before the length probe and half after it, seconds apart, so that one slow stretch of the machine
    is a minority of the blocks, and each figure is the median of its blocks' means."""

    def __init__(self, pool, runner, slots: np.ndarray, inference: dict, seed: int) -> None:
        self.pool, self.slots = pool, slots
        self.lockstep = _LockstepRows(pool, runner, slots, inference, seed)
        self.ver = _VerRows(pool, runner, slots, inference, seed)
        self.seeds = iter(range(seed * 1_000_003 + 700_000, seed * 1_000_003 + 800_000))

    async def time(self, blocks: int, *, fresh: bool = False) -> None:
        """`blocks` blocks of each; `fresh`: first reset every slot, untimed (after the length probe,
        whose last row may have left some of them ended)."""
        if fresh:
            await _reset_ended(self.pool, self.slots, self.seeds)
        for _ in range(blocks):
            await self.lockstep.time(ROWS // ROW_BLOCKS)
            await self.ver.time(ROWS // ROW_BLOCKS)

    def timing(self) -> tuple[RowTiming, float]:
        """(the lock-step rows' timing, the VER rows' broker part)."""
        return self.lockstep.timing(), self.ver.broker_s()


def _row_slope(costs: SimulatorCosts, rows: RowTiming, per_server: int) -> float:
    """A server's Step cost per slot: the probe's, or what makes a call of the row's `per_server`
    slots cost the server time the rows waited for, whichever is more. The probe's slope reads 0 below
    its noise (NOISE_S), where 15 slots' steps still cost 0.05 ms more than one's on `off`; and a row
    waits for the slower of its servers, whose mean is above either's median."""
    if per_server < 2:
        return costs.step_per_slot_s
    return max(costs.step_per_slot_s, (rows.server_s - costs.step_s) / (per_server - 1))


def _limit_costs(costs) -> Costs:
    """The probed costs as the limit of jobs/bench/limits.py takes them."""
    return Costs(
        reset_fixed_s=costs.reset_fixed_s,
        reset_fixed_exclusive=costs.reset_exclusive,
        map_load_s=costs.map_load_s,
        map_load_cached_s=costs.map_load_cached_s,
        map_load_shared=costs.loads_shared,
        reset_blocks_steps=costs.reset_blocks_steps,
    )


def _row(p: Prediction, workload: Workload, costs: Costs) -> dict:
    """A prediction with the limit its pattern meets under the probed costs (jobs/bench/limits.py)."""
    per_server = workload.slots_per_server
    pattern = Pattern(
        slots=workload.num_slots,
        servers=workload.servers,
        step_latency_s=workload.server_costs(0).step_call_s(per_server, loading=False),
        eta=p.eta,
        resets_per_valid=p.slot_resets_per_1k_valid / 1000.0,
        reset_calls_per_valid=p.reset_calls_per_1k_valid / 1000.0,
        hit_rate=p.cache_hit_rate if math.isfinite(p.cache_hit_rate) else 0.0,
    )
    limit = pattern_limit(costs, pattern)
    return {**p.as_dict(), "limit": limit.limit, "limit_binding": limit.binding}


def _lengths_record(lengths) -> dict:
    cdf = np.cumsum(lengths.probabilities)

    def quantile(q: float) -> int:
        return int(lengths.values[min(int(np.searchsorted(cdf, q)), lengths.values.size - 1)])

    return {
        "mean": lengths.mean,
        "longest": lengths.longest,
        "p10_p50_p90": [quantile(q) for q in (0.1, 0.5, 0.9)],
        "values": lengths.values.tolist(),
        "probabilities": lengths.probabilities.tolist(),
    }


def json_safe(value):
    """`value` with every NaN or infinity as None (JSON has neither), numpy scalars as Python's."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value

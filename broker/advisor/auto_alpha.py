"""`--alpha auto`: at each iteration boundary, the alpha the advisor's model predicts fastest for
this run, from the run's own measured costs and its own episode lengths (docs/advisor.md).

What it reads, over a sliding window (the last `cost_iterations` iterations, the last
`window_episodes` episodes), all of it what the lock-step sampler already measures:

    a row          (sampling wall - Reset wall - forward passes - rounds' own work) / rows: a lock-step row's Step as
                   the broker waits it (the slowest server's call, transport, the broker's own work
                   per row), split into a fixed part and a part per slot acting on the row's busiest
                   server: the slope is least squares over the window's rows (each row's wall outside
                   forward passes against its acting slots, >= 0), the fixed part what then makes the
                   window's mean. Without the slope a padded row (few slots acting, as at high alpha)
                   cost as much as a full one, which tilted every curve towards low alphas: predicted
                   0.85 to 1.10 of measurement from alpha 0.1 to 1.0 under `calibrated`
    a Reset call   wall = reset_fixed_s + k * reset_per_slot_s, k the slots in the call: least squares
                   over the window's rounds' calls, one a server (both >= 0); when k did not vary
                   (truncation `reset` resets every slot each round) the whole wall is the fixed part.
                   Each call, not only each round's slowest: the other servers' calls widen the range
                   of k the line is drawn through (a round of alpha 0.5 resets 3 or 4 slots on its
                   busiest server, 1 to 4 on the others)
    a round        its wall outside its rows, Reset calls and forward passes (opening and closing it,
                   the truncation's bookkeeping), the window's mean: the model's `round_s`. Spread
                   over the rows instead, it was charged by the row where it is paid by the round,
                   too little at low alphas (a round every few rows) and too much at high ones
    a forward pass  forward-pass time / (rows * servers): the model runs one per server and row
    the lengths    Kaplan-Meier (lengths.py) over the window's episodes: ended by the env
                   (terminated, clip end) are events; cut by a global truncation, lost to a fault,
                   or still running at the last boundary are censored (they lasted at least that)

The costs go into the model as effective ones (a call costs what the run measured it to cost,
prepared loads and map-cache hits included), so the model runs without prefetch or a catalog. The
rule: the model's effective throughput for each alpha of the grid (ALPHA_GRID's values inside
[alpha_min, alpha_max] plus both ends), over a capped horizon (`Horizon`: every slot started
mid-episode as a long run finds it, a warm-up iteration of at most WARMUP_SAMPLES valid transitions,
then MODEL_ITERATIONS measured of at most `max_samples`), every alpha on the same seed with each
slot's episodes drawn from a stream of its own (model.py `_SlotEpisodes`), so the alphas' points
differ by their rules, not by their draws. The curve is still noisy: with one measured iteration of
1,024 transitions and the draws shared in reset order, one seed's point moved by 9% to 26% against
alpha 0.5's (`calibrated`, 16 seeds), more than the neighbouring alphas differ, and choices jumped
between alphas 0.4 and 1.0 whose measured throughputs are within 10%; with the streams and four
iterations of 2,048 that spread is 2% to 6%. So each decision plays `seeds_per_decision` fresh seeds,
the curve it goes by is the mean of the last `smooth_decisions` decisions' curves (the policy moves
slowly against that), and the alpha in force is kept unless another's smoothed prediction beats it
by more than `margin`. Before anything is measured it answers `prior` (0.5, held inside the bounds).

Pure: no sockets, no asyncio; the broker (broker/run.py) feeds it each iteration's figures and
applies its answer at the next boundary.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from broker.advisor.lengths import EpisodeLengths
from broker.advisor.model import ALPHA_GRID, Horizon, SimulatorCosts, Workload, best_alpha

PRIOR_ALPHA = 0.5  # before the run has measured anything (DPSA's default)
WINDOW_EPISODES = 512  # episodes the length estimate reads: recent enough to follow a learning policy
COST_ITERATIONS = 4  # iterations the costs are averaged over
MAX_SAMPLES = 2048  # valid transitions of each of the model's measured iterations (at most) ...
MODEL_ITERATIONS = 4  # ... and how many: with one seed the grid costs about 0.5 s here
WARMUP_SAMPLES = 512  # ... and of its warm-up iteration, which brings carried episodes to a steady state
SEEDS_PER_DECISION = 1  # model runs per alpha and decision
SMOOTH_DECISIONS = 4  # decisions whose curves are averaged
MARGIN = 0.03  # another alpha must be predicted this much faster than the one in force to replace it


def alpha_grid(alpha_min: float, alpha_max: float) -> tuple[float, ...]:
    """The alphas tried: both bounds and ALPHA_GRID's values strictly between them, increasing."""
    if not 0.0 < alpha_min <= alpha_max <= 1.0:
        raise ValueError(f"alpha_min={alpha_min!r}, alpha_max={alpha_max!r}: give 0 < alpha_min <= alpha_max <= 1")
    inside = [a for a in ALPHA_GRID if alpha_min + 1e-9 < a < alpha_max - 1e-9]
    return tuple(dict.fromkeys([alpha_min, *inside, alpha_max]))


@dataclass(frozen=True)
class IterationCosts:
    """What one iteration of `fast` cost, as the sampler measured it (broker/metrics.py IterationStats)."""

    rows: int  # lock-step rows (transitions / slots)
    wall_s: float  # sampling wall time
    reset_wall_s: float  # of which awaiting Reset calls
    inference_s: float  # of which forward passes
    round_resets: tuple[tuple[int, float], ...] = ()  # per batched Reset call of a round: (slots in it, wall s)
    row_steps: tuple[tuple[int, float], ...] = ()  # per row: (slots acting on the busiest server, wall s)
    round_overheads: tuple[float, ...] = ()  # per round: its wall s outside its rows, Resets and forward passes


@dataclass(frozen=True)
class MeasuredCosts:
    """The run's costs as the model takes them (module docstring)."""

    row_s: float  # a lock-step row's fixed part ...
    reset_fixed_s: float
    reset_per_slot_s: float
    inference_s: float  # one forward pass
    row_per_slot_s: float = 0.0  # ... and its part per slot acting on the busiest server
    round_s: float = 0.0  # the broker's own work a round outside its rows and Resets

    def simulator_costs(self) -> SimulatorCosts:
        return SimulatorCosts(
            step_s=self.row_s,
            step_per_slot_s=self.row_per_slot_s,
            reset_fixed_s=self.reset_fixed_s,
            reset_per_slot_s=self.reset_per_slot_s,
            prepare=False,
        )


def fit_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(fixed, per slot) >= 0 with wall ~ fixed + k * per_slot over the (k, wall) points, least squares
    (a round's Reset against the slots it reset, a row against the slots acting in it)."""
    if not points:
        return 0.0, 0.0
    k = np.array([r[0] for r in points], dtype=float)
    wall = np.array([r[1] for r in points], dtype=float)
    if np.ptp(k) == 0:  # no spread: the split is not identified, and every round costs the same anyway
        return float(wall.mean()), 0.0
    slope = float(np.cov(k, wall, bias=True)[0, 1] / k.var())
    fixed = float(wall.mean() - slope * k.mean())
    if slope < 0:
        return float(wall.mean()), 0.0
    if fixed < 0:
        return 0.0, float((k @ wall) / (k @ k))
    return fixed, slope


@dataclass(frozen=True)
class AlphaChoice:
    """One decision: the alpha, why (`source`: prior, fixed by the bounds, or the model) and on what."""

    alpha: float
    source: str  # "prior" | "bounds" | "model"
    grid: tuple[float, ...]
    predicted: tuple[float, ...] = ()  # smoothed effective throughput per alpha of the grid (model only)
    held: bool = False  # the alpha in force kept, though another was predicted faster by less than the margin
    costs: MeasuredCosts | None = None
    episodes: int = 0  # in the window, censored included
    censored: int = 0
    length_mean: float = math.nan  # of the Kaplan-Meier estimate
    decision_s: float = 0.0  # wall time of the decision

    def as_dict(self) -> dict:
        """The metrics line's `alpha_auto` entry (docs/metrics.md)."""
        out = {
            "alpha": self.alpha,
            "source": self.source,
            "grid": list(self.grid),
            "predicted_throughput": list(self.predicted),
            "held": self.held,
            "episodes": self.episodes,
            "censored": self.censored,
            "length_mean": None if math.isnan(self.length_mean) else self.length_mean,
            "decision_s": self.decision_s,
        }
        if self.costs is not None:
            out["costs_s"] = {
                "row": self.costs.row_s,
                "row_per_slot": self.costs.row_per_slot_s,
                "round": self.costs.round_s,
                "reset_fixed": self.costs.reset_fixed_s,
                "reset_per_slot": self.costs.reset_per_slot_s,
                "inference": self.costs.inference_s,
            }
        return out


@dataclass
class AutoAlpha:
    """The run's window of costs and episode lengths, and the alpha they make the model choose."""

    alpha_min: float
    alpha_max: float
    servers: int
    slots_per_server: int
    t_max: int
    samples_per_iteration: int
    truncation: str = "carry"
    window_episodes: int = WINDOW_EPISODES
    cost_iterations: int = COST_ITERATIONS
    max_samples: int = MAX_SAMPLES
    seeds_per_decision: int = SEEDS_PER_DECISION
    smooth_decisions: int = SMOOTH_DECISIONS
    margin: float = MARGIN
    _costs: deque = field(init=False, repr=False)
    _episodes: deque = field(init=False, repr=False)  # (length, censored)
    _running: list[int] = field(init=False, repr=False, default_factory=list)
    _curves: deque = field(init=False, repr=False)  # the last decisions' predicted curves
    _decisions: int = field(init=False, repr=False, default=0)  # model decisions made: the next seeds
    _in_force: float | None = field(init=False, repr=False, default=None)
    _shape: tuple | None = field(init=False, repr=False, default=None)  # what the curves were played on

    def __post_init__(self) -> None:
        self.grid = alpha_grid(self.alpha_min, self.alpha_max)
        if self.servers < 1 or self.slots_per_server < 1:
            raise ValueError(f"servers={self.servers}, slots_per_server={self.slots_per_server}: give >= 1 of each")
        if self.seeds_per_decision < 1 or self.smooth_decisions < 1 or self.margin < 0:
            raise ValueError(
                f"seeds_per_decision={self.seeds_per_decision}, smooth_decisions={self.smooth_decisions}, "
                f"margin={self.margin}: give >= 1, >= 1 and >= 0"
            )
        self._costs = deque(maxlen=self.cost_iterations)
        self._episodes = deque(maxlen=self.window_episodes)
        self._curves = deque(maxlen=self.smooth_decisions)

    def observe(self, costs: IterationCosts, ended: list[tuple[int, bool]], running: list[int]) -> None:
        """One iteration: its costs, the episodes that ended in it ((length, censored) each: cut or
        lost to a fault is censored) and the lengths of those still running at its end (censored, and
        replaced by the next iteration's: they end, or run on, later)."""
        if costs.rows > 0:
            self._costs.append(costs)
        self._episodes.extend((int(n), bool(c)) for n, c in ended if n >= 1)
        self._running = [int(n) for n in running if n >= 1]

    def observe_iteration(self, stats) -> None:
        """`observe` one sampled iteration of fast from its IterationStats (broker/metrics.py), as the
        broker and the alpha benchmark (benchmarks/alpha_auto.py) both feed it."""
        self.observe(
            IterationCosts(
                rows=stats.transitions // stats.num_slots,
                wall_s=stats.wall_s,
                reset_wall_s=stats.reset_wall_s,
                inference_s=stats.inference_s,
                round_resets=tuple(stats.round_resets),
                row_steps=tuple(stats.row_steps),
                round_overheads=tuple(stats.round_overheads),
            ),
            list(zip(stats.episode_lengths, stats.episode_censored)),
            stats.running_lengths,
        )

    def measured_costs(self) -> MeasuredCosts | None:
        """The window's costs (module docstring); None before an iteration was observed."""
        if not self._costs:
            return None
        rows = sum(c.rows for c in self._costs)
        overheads = [o for c in self._costs for o in c.round_overheads]
        outside = sum(c.wall_s - c.reset_wall_s - c.inference_s for c in self._costs) - sum(overheads)
        per_row = outside / rows
        inference = sum(c.inference_s for c in self._costs) / (rows * self.servers)
        fixed, per_slot = fit_line([r for c in self._costs for r in c.round_resets])
        rows_seen = [r for c in self._costs for r in c.row_steps]
        _, row_per_slot = fit_line(rows_seen)
        acting = float(np.mean([k for k, _ in rows_seen])) if rows_seen else 0.0
        row_fixed = per_row - row_per_slot * acting
        if row_fixed < 0 and acting > 0:  # the slope over-reaches the window's mean: all of it per slot
            row_fixed, row_per_slot = 0.0, per_row / acting
        round_s = float(np.mean(overheads)) if overheads else 0.0
        return MeasuredCosts(
            row_s=max(row_fixed, 0.0),
            reset_fixed_s=fixed,
            reset_per_slot_s=per_slot,
            inference_s=inference,
            row_per_slot_s=max(row_per_slot, 0.0),
            round_s=round_s,
        )

    def lengths(self) -> tuple[EpisodeLengths | None, int, int]:
        """The Kaplan-Meier estimate of the window (None when it is empty), its episodes and censored ones."""
        sample = list(self._episodes) + [(n, True) for n in self._running]
        if not sample:
            return None, 0, 0
        lengths = np.array([n for n, _ in sample], dtype=np.int64)
        censored = np.array([c for _, c in sample], dtype=bool)
        return EpisodeLengths.from_sample(lengths, censored), lengths.size, int(censored.sum())

    def workload(self, costs: MeasuredCosts, lengths: EpisodeLengths) -> Workload:
        return Workload(
            lengths,
            costs.simulator_costs(),
            servers=self.servers,
            slots_per_server=self.slots_per_server,
            inference_s=costs.inference_s,
            round_s=costs.round_s,
        )

    def horizon(self) -> Horizon:
        samples = min(self.samples_per_iteration, self.max_samples)
        # A steady start: the run has gone on for long, so its slots are mid-episode. Started fresh, the
        # short warm-up leaves too few episodes ending when they are long (a trained policy's), which
        # under-counted rounds and over-predicted low alphas by up to a third (docs/advisor.md).
        return Horizon(
            samples,
            iterations=MODEL_ITERATIONS,
            warmup_iterations=1,
            warmup_samples=min(samples, WARMUP_SAMPLES),
            steady_start=True,
        )

    def seeds(self) -> range:
        """The model's seeds for the next decision: fresh ones each decision (their noise averages out)."""
        first = self._decisions * self.seeds_per_decision
        return range(first, first + self.seeds_per_decision)

    def curve(self, workload: Workload, seeds: range) -> np.ndarray:
        """The model's effective throughput for each alpha of the grid (`best_alpha`'s predictions), the
        mean over `seeds`."""
        return np.mean(
            [
                [
                    p.effective_throughput
                    for p in best_alpha(
                        workload,
                        alphas=self.grid,
                        t_max=self.t_max,
                        truncation=self.truncation,
                        horizon=self.horizon(),
                        seed=seed,
                    )[1]
                ]
                for seed in seeds
            ],
            axis=0,
        )

    def choose(self) -> AlphaChoice:
        """The alpha for the next iteration (module docstring); the caller puts it in force."""
        started = time.perf_counter()
        if len(self.grid) == 1:
            return AlphaChoice(self.grid[0], "bounds", self.grid)
        costs = self.measured_costs()
        lengths, episodes, censored = self.lengths()
        if costs is None or lengths is None:
            return AlphaChoice(min(max(PRIOR_ALPHA, self.alpha_min), self.alpha_max), "prior", self.grid)
        shape = (self.servers, self.slots_per_server, self.t_max, self.horizon())
        if shape != self._shape:  # a server left, or the user changed t_max or the batch: older curves are moot
            self._curves.clear()
            self._shape = shape
        self._curves.append(self.curve(self.workload(costs, lengths), self.seeds()))
        self._decisions += 1
        smoothed = np.mean(self._curves, axis=0)
        best = int(np.argmax(smoothed))  # the first of a tie
        held = False
        if self._in_force in self.grid and best != self.grid.index(self._in_force):
            kept = self.grid.index(self._in_force)
            held = smoothed[best] <= smoothed[kept] * (1.0 + self.margin)
            best = kept if held else best
        self._in_force = self.grid[best]
        return AlphaChoice(
            self.grid[best],
            "model",
            self.grid,
            predicted=tuple(float(v) for v in smoothed),
            held=held,
            costs=costs,
            episodes=episodes,
            censored=censored,
            length_mean=lengths.mean,
            decision_s=time.perf_counter() - started,
        )

"""`--mode auto`: which sampling mode the next iteration uses, from the throughput the run itself
measured in each mode (docs/advisor.md).

Every mode gives complete on-policy batches for SMPO, so a run may change mode at any iteration
boundary; every iteration, in whatever mode, is trained on: nothing is thrown away. The rules, and why:

- **Candidates** (`mode_candidates`, default fast, ver, autoreset): the modes it may use. sc is the
  one-slot reference (never the fastest with more than one slot) and sgr is fast's worst case (fast
  with alpha at its smallest, every round ended by the first episode that ends), so neither is a
  default candidate; either may be listed.
- **Start**: the first candidate, for the first iteration: list the advisor's pick first (`fast
  advise` recommends a mode for the simulators). Then every other candidate is probed once, in the
  order listed. The model (model.py) is not asked to order or skip those first probes: the window
  `--alpha auto` measures holds fast's lock-step rows only, one figure per row, which does not tell a
  Step call's fixed cost from its per-slot cost, and that split is what ver and autoreset turn on; and
  an order would save nothing, as every candidate is measured once within the first
  len(candidates) iterations either way, and a measured figure replaces any prediction.
- **Measured effective throughput** of a mode: valid transitions / sampling wall seconds over its last
  `window` (3) iterations, the same figure as metrics' `effective_throughput`, summed over them. The
  first iteration after a switch pays the switch (the new sampler starts every slot fresh; the live
  episodes were cut at the last batch's end, as truncations): it is kept in the figure, undiscounted. A
  probe is always such a first iteration, so a discount would leave a probed mode without a figure, and
  the mode the run comes back to after a probe round pays the same once in its own window; a switch
  must then pay for itself, which leans towards staying, as the margin does.
- **Probes**: each other candidate is probed (runs one iteration) once the iterations in the mode in
  force since its last probe reach its interval; the candidates due at one boundary run one after
  the other (a probe round), then the decision. Probing costs throughput when the mode in force is the
  best, so after a round that did not switch the interval doubles, up to MAX_BACKOFF x probe_every; a
  switch brings it back to probe_every (the workload changed; look again soon). The first round (after
  the start, or after auto is turned on live) does not double it.
- **Far behind, probed rarely**: a candidate whose last figure is below `far` (FAR, 0.75) of the mode
  in force's current figure waits the longest interval, MAX_BACKOFF x probe_every, whatever the round
  or the switch. A probe of a mode at 0.6 of the mode in force costs 0.4 of an iteration's worth of
  transitions and can hardly end in a switch (it would have to gain 80% to pass the margin); those
  probes were most of what `--mode auto` lost over a 30-iteration run (docs/advisor.md, "Measured").
  The test is made at every boundary against the mode in force's current figure, so a mode in force
  that slows down (a learning policy's episodes change what each mode pays) brings the others back to
  the ordinary interval; a far mode that speeds up is seen at its next probe only.
- **Switch** at the decision after a round, when the best candidate measured in that round beats the
  mode in force by more than `margin` (0.1: 10%); a mode in force that is not a candidate (auto turned
  on live in sgr) gives way to the best candidate measured, whatever the margin. Only then, and only
  on that round's figures: between rounds the alternatives' figures are old and the mode in force's
  fresh, and a comparison across that gap would switch on drift (a learning policy's episodes lengthen
  in every mode).
- A mode with no figure yet (none of its iterations sampled anything) is not compared; with a single
  candidate there is nothing to probe: it stays.

Pure: no sockets, no asyncio; the broker (broker/run.py) feeds it each iteration's figures and
applies its answer at the next boundary, by making a fresh sampler of that mode.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from broker.samplers import MODE_NAMES

DEFAULT_CANDIDATES: tuple[str, ...] = ("fast", "ver", "autoreset")
PROBE_EVERY = 10  # iterations in the mode in force between probe rounds (at first, and after a switch)
MAX_BACKOFF = 8  # the interval doubles after a round that did not switch, up to this many x probe_every
MARGIN = 0.1  # a candidate must beat the mode in force by more than this share
FAR = 0.75  # a candidate below this share of the mode in force is probed every MAX_BACKOFF x probe_every
WINDOW = 3  # a mode's figure is over its last this many iterations


def check_candidates(candidates: Sequence[str]) -> tuple[str, ...]:
    """The candidates as a tuple; ValueError unless they are known modes, at least one, none twice."""
    unknown = [m for m in candidates if m not in MODE_NAMES]
    if unknown:
        raise ValueError(f"mode_candidates has {', '.join(map(repr, unknown))}; use modes of {', '.join(MODE_NAMES)}")
    if not candidates:
        raise ValueError(f"mode_candidates is empty; give at least one of {', '.join(MODE_NAMES)}")
    if len(set(candidates)) != len(candidates):
        raise ValueError(f"mode_candidates lists a mode twice ({', '.join(candidates)}); give each once")
    return tuple(candidates)


@dataclass(frozen=True)
class Figure:
    """One iteration's measurement."""

    valid: int
    wall_s: float
    first_after_switch: bool = False


@dataclass(frozen=True)
class ModeChoice:
    """One decision: the mode, why, and on what figures."""

    mode: str
    source: str  # "start" | "probe" | "stay" | "switch"
    throughput: dict[str, float | None]  # measured effective throughput per candidate (None: no figure yet)
    iterations: dict[str, int]  # of each, in its window
    probe_every: int  # the interval in force
    probe_in: int | None  # iterations after this one before the next probe (0: the next); None: decided after it

    def as_dict(self, iteration: int) -> dict:
        """The metrics line's `mode_auto` entry (docs/metrics.md), for the line of `iteration`."""
        return {
            "mode": self.mode,
            "source": self.source,
            "throughput": dict(self.throughput),
            "iterations": dict(self.iterations),
            "probe_every": self.probe_every,
            "next_probe_iteration": None if self.probe_in is None else iteration + 1 + self.probe_in,
        }


@dataclass
class AutoMode:
    """The run's figures per mode and the mode they make it choose (module docstring)."""

    candidates: tuple[str, ...] = DEFAULT_CANDIDATES
    probe_every: int = PROBE_EVERY
    margin: float = MARGIN
    window: int = WINDOW
    max_backoff: int = MAX_BACKOFF
    far: float = FAR
    home: str = field(init=False)  # the mode in force between probe rounds
    _figures: dict[str, deque] = field(init=False, repr=False)
    _round: list[str] = field(init=False, repr=False, default_factory=list)  # probes of the round still to run
    _probed: list[str] = field(init=False, repr=False, default_factory=list)  # the round's modes, for its decision
    _deciding: bool = field(init=False, repr=False, default=False)  # a round ran: decide at the next choice
    _started: bool = field(init=False, repr=False, default=False)
    _first_round: bool = field(init=False, repr=False, default=True)
    _interval: int = field(init=False, repr=False, default=0)
    _since: dict[str, int] = field(init=False, repr=False, default_factory=dict)  # home iterations since its probe

    def __post_init__(self) -> None:
        self.candidates = check_candidates(self.candidates)
        if self.probe_every < 1 or self.window < 1 or self.max_backoff < 1:
            raise ValueError(f"probe_every={self.probe_every}, window={self.window}, max_backoff={self.max_backoff}")
        if not self.margin >= 0:
            raise ValueError(f"margin={self.margin!r}: give a share >= 0")
        if not 0 <= self.far <= 1:
            raise ValueError(f"far={self.far!r}: give a share in [0, 1] (0: no candidate counts as far behind)")
        self._figures = {m: deque(maxlen=self.window) for m in MODE_NAMES}
        self.take_over(self.candidates[0])

    def take_over(self, mode: str) -> None:
        """Auto starts (or is turned on live) in `mode`: it samples the next iteration, then a probe round."""
        if mode not in MODE_NAMES:
            raise ValueError(f"mode {mode!r} is unknown; use one of {', '.join(MODE_NAMES)}")
        self.home, self._round, self._probed, self._deciding = mode, [], [], False
        self._started, self._first_round = False, True
        self._interval = self.probe_every
        self._since = {m: self._interval for m in self._alternatives()}  # every one due after the start

    def observe(self, mode: str, valid: int, wall_s: float, *, first_after_switch: bool = False) -> None:
        """One iteration sampled in `mode` (any mode: figures are kept while auto is off too)."""
        if wall_s > 0 and valid >= 0:
            self._figures[mode].append(Figure(int(valid), float(wall_s), first_after_switch))

    def throughput(self, mode: str) -> float | None:
        """Valid transitions / s over the mode's window; None before it has a figure."""
        figures = self._figures[mode]
        wall = sum(f.wall_s for f in figures)
        return sum(f.valid for f in figures) / wall if wall > 0 else None

    def interval(self, mode: str) -> int:
        """Iterations in the mode in force between probes of `mode`: the longest while it is far behind."""
        mine, home = self.throughput(mode), self.throughput(self.home)
        if mine is not None and home and mine < self.far * home:
            return self.max_backoff * self.probe_every
        return self._interval

    def choose(self) -> ModeChoice:
        """The mode of the next iteration (module docstring)."""
        if self._round:
            return self._probe()
        if self._deciding:
            return self._decide()
        if not self._started:
            self._started = True
            return self._answer(self.home, "start", probe_in=0 if self._since else None)
        due = [m for m in self._alternatives() if self._since[m] >= self.interval(m)]
        if due:
            self._round, self._probed, self._deciding = due, list(due), True
            return self._probe()
        return self._stay("stay")

    def _alternatives(self) -> list[str]:
        return [m for m in self.candidates if m != self.home]

    def _probe(self) -> ModeChoice:
        mode = self._round.pop(0)
        return self._answer(mode, "probe", probe_in=0 if self._round else None)

    def _stay(self, source: str) -> ModeChoice:
        """An iteration in the mode in force: it counts towards every alternative's next probe."""
        for m in self._since:
            self._since[m] += 1
        probe_in = min((self.interval(m) - n for m, n in self._since.items()), default=None)
        return self._answer(self.home, source, probe_in=None if probe_in is None else max(probe_in, 0))

    def _decide(self) -> ModeChoice:
        self._deciding = False
        fresh = [m for m in self.candidates if m in self._probed or m == self.home]
        measured = {m: t for m in fresh if (t := self.throughput(m)) is not None}
        best = max(measured, key=measured.__getitem__, default=None)  # a tie: the first listed
        home = self.throughput(self.home) if self.home in self.candidates else None
        switch = best is not None and best != self.home and (home is None or measured[best] > home * (1 + self.margin))
        if switch:
            self.home, self._interval = best, self.probe_every
            self._since = dict.fromkeys(self._alternatives(), 0)
        else:
            if not self._first_round:
                self._interval = min(2 * self._interval, self.max_backoff * self.probe_every)
            for m in self._probed:
                self._since[m] = 0
        self._first_round, self._probed = False, []
        return self._stay("switch" if switch else "stay")  # this iteration is the first of the interval

    def _answer(self, mode: str, source: str, *, probe_in: int | None) -> ModeChoice:
        shown = list(self.candidates) + ([] if self.home in self.candidates else [self.home])
        return ModeChoice(
            mode,
            source,
            {m: self.throughput(m) for m in shown},
            {m: len(self._figures[m]) for m in shown},
            self._interval,
            probe_in,
        )

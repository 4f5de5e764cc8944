"""What each sampling mode would give on a simulator, from its measured costs: the broker's own
rules, played in simulated time (events.py), against a model of the simulator's costs.

**The simulator** (`SimulatorCosts`, per server) is the cost model's rules (sim_server/cost_model.py)
with measured numbers in place of configured ones:

    Step call of k slots      step_s + k * step_per_slot_s  (x (1 + prefetch_step_penalty) while a
                              background load runs on the server)
    Reset call of k slots     wait for its prepared slots' loads; then the fixed part
                              reset_fixed_s + k * reset_per_slot_s (through the one reset engine
                              when `reset_exclusive`, FIFO; and, when `reset_blocks_steps`, in the
                              engine's turn against Steps); then the loads of its unprepared slots,
                              priced against the map cache once the fixed part is done: map_load_s,
                              or map_load_cached_s for a cached map or one the call already loads;
                              one after another on the load channel when `loads_shared` (FIFO
                              across calls), else side by side (the slowest)
    Prepare of a slot         a background load through the same channel and cache (`prepare`)
    the server's compute      of a Step call, `step_compute_share` of its time, first; of a Reset,
                              `reset_compute_share` of its fixed part, last (the servicer's order):
                              on the server's one thread, FIFO with its other calls' compute, so a
                              Reset's compute stops a concurrent Step's on a CPU-bound simulator

With a `Catalog` (each clip's map) the map cache is the server's LRU over the maps dealt to it by
the broker's own dealer (broker/dealer.py, with map locality when asked); without one each reset
slot's map is cached with probability `hit_rate`.

**The broker** is each mode's rule, read from broker/samplers/: the lock-step loop (lockstep.py)
with the rule objects themselves (`LOCKSTEP_RULES`: sc drives one slot; autoreset resets each ended
slot in a call of its own before the next row; sgr and fast open a round with one batched Reset
per server and close it when the rule says, `Dpsa.round_over` being DPSA's termination-rate and
t_max trigger; `carry` keeps the live episodes, `reset` cuts them); rounds unpipelined, one forward
pass per server and row (rounds.py `_lockstep`); and VER's loop (ver.py): every slot on its own,
inference batched over the slots waiting at that moment, steps batched per server (StepBatcher:
a server's call goes once every stepping slot of it has queued, or after 2 ms), each iteration a
budget of steps. Prefetch deals and prepares a slot's next clip when its episode starts, as the
samplers do. Inference occupies the broker's one thread for `inference_s + batch *
inference_per_obs_s`; `call_s` is the broker's part of every call, of which `call_cpu_s` holds the
broker's thread (in turn with the other work on it), in two turns: sending the call before the
server's part and receiving its answer (`call_receive_cpu_s`) after it; the rest is a wait that
other work overlaps;
and each VER slot-step takes `ver_slot_s` of the broker's thread (its coroutine's turn, the batchers'
futures) once answered.

An iteration is the samplers' own: until `samples_per_iteration` valid transitions (rounds end at
the round that crossed it), then one bootstrap pass. Figures are over the measured iterations, after
`warmup_iterations` (docs/advisor.md says where the model is known to be off).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field, fields, replace

import numpy as np

from broker.advisor.events import Event, Lock, Process, Sim, Turns
from broker.advisor.lengths import EpisodeLengths
from broker.dealer import ClipDealer, MapLocality
from broker.samplers import LOCKSTEP_RULES, MODE_NAMES
from broker.samplers.fast import TRUNCATIONS

# ver.py's StepBatcher: a server's queued steps go out at the latest this long after the first.
VER_GATHER_S = 0.002


@dataclass(frozen=True)
class SimulatorCosts:
    """What one simulator server's calls cost, in seconds (module docstring for the rules)."""

    step_s: float = 0.0  # a Step call, whatever its slots ...
    step_per_slot_s: float = 0.0  # ... plus this per slot in it
    reset_fixed_s: float = 0.0  # a Reset call's fixed part, whatever its slots ...
    reset_per_slot_s: float = 0.0  # ... plus this per slot in it, in the same turn of the engine
    reset_exclusive: bool = True  # one reset engine: the fixed parts of concurrent Resets queue
    reset_blocks_steps: bool = False  # the engine stops stepping while a fixed part runs
    map_load_s: float = 0.0  # a reset slot's map load from scratch ...
    map_load_cached_s: float = 0.0  # ... and of a cached map
    loads_shared: bool = True  # one load channel: loads queue, one after another
    map_cache_size: int = 4  # maps the server keeps (LRU); with a Catalog
    hit_rate: float | None = None  # without a Catalog: the chance that a reset slot's map is cached
    prepare: bool = True  # serves Prepare: a slot's next map loads in the background
    prefetch_step_penalty: float = 0.0  # a Step is this fraction slower while a background load runs
    # Of a Step call's time and of a Reset's fixed part, the share that is the server's own compute (its
    # env's step or reset, the `compute_s` of the call's timing). The servicer runs the env on its event
    # loop (sim_server/simulator.py), so compute holds the server's one thread: a Reset's compute and a
    # concurrent Step's take turns, whatever the emulated engine's rules say of the waits around them.
    step_compute_share: float = 0.0
    reset_compute_share: float = 0.0

    def __post_init__(self) -> None:
        for name in ("step_compute_share", "reset_compute_share"):  # before the seconds: a share has its own range
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)!r}: a share of the call's time, in [0, 1]")
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float | int) and not isinstance(value, bool) and not value >= 0:
                raise ValueError(f"{f.name}={value!r}: costs are seconds (or counts) >= 0")
        if self.hit_rate is not None and not 0.0 <= self.hit_rate <= 1.0:
            raise ValueError(f"hit_rate={self.hit_rate!r}: a share of reset slots, in [0, 1]")

    @classmethod
    def from_cost_model(cls, config, **overrides) -> SimulatorCosts:
        """The costs of a cost-model configuration (anything with CostModelConfig's or Describe's
        CostModel field names: sim_server/cost_model.py), then `overrides`."""
        costs = cls(
            step_s=float(config.step_latency_s),
            reset_fixed_s=float(config.reset_fixed_s),
            reset_exclusive=bool(config.reset_fixed_exclusive),
            reset_blocks_steps=bool(config.reset_blocks_steps),
            map_load_s=float(config.map_load_s),
            map_load_cached_s=float(config.map_load_cached_s),
            loads_shared=bool(config.map_load_shared),
            map_cache_size=int(config.map_cache_size),
            prefetch_step_penalty=float(getattr(config, "prefetch_step_penalty", 0.0)),
        )
        return replace(costs, **overrides)

    def step_call_s(self, slots: int, *, loading: bool) -> float:
        return (self.step_s + slots * self.step_per_slot_s) * (1.0 + (self.prefetch_step_penalty if loading else 0.0))


@dataclass(frozen=True)
class Catalog:
    """The clips the broker deals and the map each plays on (`Describe.clip_map_ids`)."""

    clip_map_ids: np.ndarray  # [num_clips]
    holdout_every: int = 10  # the broker's split (broker/dealer.py HOLDOUT_EVERY)
    locality_max_repeat: int = 8


@dataclass(frozen=True)
class Workload:
    """Everything but the mode: the simulators, their slots, the episodes, the broker's own costs."""

    lengths: EpisodeLengths
    costs: SimulatorCosts | tuple[SimulatorCosts, ...]  # one for every server, or one per server
    servers: int = 1
    slots_per_server: int = 1
    inference_s: float = 0.0  # one forward pass ...
    inference_per_obs_s: float = 0.0  # ... plus this per observation in it
    call_s: float = 0.0  # transport of each Step, Reset or Prepare call, on top of the server's time
    # Of call_s, the part each call holds the broker's one thread (grpc.aio works on the loop's thread):
    # a row of `servers` calls at once pays servers * call_cpu_s of it in turn and then waits the rest,
    # call_s - servers * call_cpu_s, so a lock-step row costs call_s either way; what changes is that
    # other work on the thread (VER's forward passes and slot turns, other calls) can no longer overlap it.
    call_cpu_s: float = 0.0
    # Of call_cpu_s, the part after the server's answer is in (decoding it, the pool assembling the
    # outcome); the rest sends the call. A lock-step row still costs call_s (the wait is what makes it so:
    # `_Run.send`), but where answers come at their own times (VER) a receive waits for the thread.
    call_receive_cpu_s: float = 0.0
    # VER's own work for each slot-step beyond a lock-step row's (its coroutine, the batchers' futures),
    # on the broker's thread: what makes VER slower than a lock-step loop where the simulator is cheap.
    ver_slot_s: float = 0.0
    # sgr and fast: the broker's own work a round beyond its Reset calls, rows and forward passes (opening
    # and closing it: the truncation's bookkeeping), on the broker's thread once a round.
    round_s: float = 0.0
    catalog: Catalog | None = None

    def __post_init__(self) -> None:
        if self.servers < 1 or self.slots_per_server < 1:
            raise ValueError(f"servers={self.servers}, slots_per_server={self.slots_per_server}: give >= 1 of each")
        if isinstance(self.costs, tuple) and len(self.costs) != self.servers:
            raise ValueError(f"{len(self.costs)} costs for {self.servers} servers: give one, or one per server")
        for name in (
            "inference_s",
            "inference_per_obs_s",
            "call_s",
            "call_cpu_s",
            "call_receive_cpu_s",
            "ver_slot_s",
            "round_s",
        ):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: seconds >= 0")
        if self.servers * self.call_cpu_s > self.call_s * (1 + 1e-9):
            raise ValueError(
                f"call_cpu_s={self.call_cpu_s!r} for {self.servers} servers exceeds call_s={self.call_s!r}: "
                "a row's calls hold the thread for at most the row's part (servers * call_cpu_s <= call_s)"
            )
        if self.call_receive_cpu_s > self.call_cpu_s:
            raise ValueError(
                f"call_receive_cpu_s={self.call_receive_cpu_s!r} exceeds call_cpu_s={self.call_cpu_s!r}: "
                "the receive is a part of the call's thread CPU"
            )

    def server_costs(self, index: int) -> SimulatorCosts:
        return self.costs[index] if isinstance(self.costs, tuple) else self.costs

    @property
    def num_slots(self) -> int:
        return self.servers * self.slots_per_server


@dataclass(frozen=True)
class ModeSettings:
    """One sampling configuration: a mode and the settings it reads."""

    mode: str
    alpha: float = 1.0  # fast
    t_max: int = 1000  # fast
    truncation: str = "carry"  # fast
    prefetch: bool = False
    locality: bool = False  # needs a Catalog
    ver_step_batching: bool = True  # ver

    def __post_init__(self) -> None:
        if self.mode not in MODE_NAMES:
            raise ValueError(f"mode {self.mode!r} is unknown; use one of {', '.join(MODE_NAMES)}")
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"alpha={self.alpha!r}: give 0 < alpha <= 1")
        if self.t_max < 1:
            raise ValueError(f"t_max={self.t_max!r}: give >= 1 step")
        if self.truncation not in TRUNCATIONS:
            raise ValueError(f"truncation {self.truncation!r} is unknown; use one of {', '.join(TRUNCATIONS)}")

    @property
    def label(self) -> str:
        """The benchmark's row name: fast+carry, ver+locality+prefetch, ..."""
        name = f"fast+{self.truncation}" if self.mode == "fast" else self.mode
        name += "" if self.ver_step_batching or self.mode != "ver" else "+perslot"
        return name + ("+locality" if self.locality else "") + ("+prefetch" if self.prefetch else "")


def standard_modes(*, alpha: float = 1.0, t_max: int = 1000, **common) -> list[ModeSettings]:
    """The benchmark's rows: sc, autoreset, sgr, ver, fast+carry and fast+reset."""
    plain = [ModeSettings(m, **common) for m in ("sc", "autoreset", "sgr", "ver")]
    return plain + [ModeSettings("fast", alpha=alpha, t_max=t_max, truncation=t, **common) for t in TRUNCATIONS]


@dataclass(frozen=True)
class Horizon:
    """How long the model runs: the samplers' iterations, warm-up first."""

    samples_per_iteration: int = 2048
    iterations: int = 3  # measured
    warmup_iterations: int = 1
    warmup_samples: int | None = None  # valid transitions of a warm-up iteration; samples_per_iteration by default
    # Start every slot mid-episode, as a run that has gone on for long finds it (EpisodeLengths.
    # sample_in_progress), rather than at a fresh reset as a benchmark starts. A fresh start takes
    # several episode lengths of warm-up to forget: until then fewer episodes end than in a long run.
    steady_start: bool = False

    def __post_init__(self) -> None:
        if self.samples_per_iteration < 1 or self.iterations < 1 or self.warmup_iterations < 0:
            raise ValueError(f"{self}: give samples_per_iteration >= 1, iterations >= 1, warmup_iterations >= 0")


@dataclass(frozen=True)
class Prediction:
    """A mode's figures as `fast bench sampling` reports them (docs/metrics.md), over the measured iterations."""

    label: str
    settings: ModeSettings
    effective_throughput: float  # valid transitions / s of sampling
    raw_throughput: float  # transitions (padding included) / s
    eta: float  # valid / transitions
    slot_resets_per_1k_valid: float
    global_resets_per_1k_valid: float
    reset_calls_per_1k_valid: float
    step_calls_per_valid: float
    episode_length_mean: float  # of the episodes that ended (or were cut) in the measured iterations
    cache_hit_rate: float  # reset or prepared slots whose map was cached; NaN when no map was priced
    valid: int
    transitions: int
    wall_s: float

    def as_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "settings"}
        out["settings"] = {f.name: getattr(self.settings, f.name) for f in fields(self.settings)}
        return out


@dataclass
class _Tally:
    """One iteration's counts."""

    valid: int = 0
    transitions: int = 0
    slot_resets: int = 0
    reset_calls: int = 0
    global_resets: int = 0
    step_calls: int = 0
    map_loads: int = 0
    map_cache_hits: int = 0
    wall_s: float = 0.0
    lengths: list[int] = field(default_factory=list)


def _hold(sim: Sim, lock: Lock, seconds: float) -> Process:
    """`seconds` of work that holds `lock` (a thread), in turn (FIFO) with the other work on it."""
    if seconds > 0:
        yield lock.acquire()
        yield sim.timeout(seconds)
        lock.release()


class _Server:
    """One simulator server's resources and map cache, in simulated time (the cost model's rules)."""

    def __init__(self, run: _Run, costs: SimulatorCosts) -> None:
        self.run, self.sim, self.costs = run, run.sim, costs
        self.thread = Lock(self.sim)  # the server's event loop: its calls' compute takes turns on it
        self.engine = Lock(self.sim) if costs.reset_exclusive else None
        self.channel = Lock(self.sim) if costs.loads_shared else None
        self.turns = Turns(self.sim) if costs.reset_blocks_steps else None
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.background_loads = 0
        self.prepared: dict[int, tuple[int, Event]] = {}  # slot -> (clip, its load done)

    def step(self, slots: int) -> Process:
        """The servicer's order: the env's step on the server's thread, then the rest of the latency
        (in the Steps' turn under `reset_blocks_steps`)."""
        yield from self.run.send()
        seconds = self.costs.step_call_s(slots, loading=self.background_loads > 0)
        compute = seconds * self.costs.step_compute_share
        yield from _hold(self.sim, self.thread, compute)
        if self.turns is not None:
            yield from self.turns.step()
        yield self.sim.timeout(seconds - compute)
        if self.turns is not None:
            self.turns.step_done()
        yield from self.run.receive()

    def reset(self, slots: list[int], clips: list[int]) -> Process:
        yield from self.run.send()
        unprepared = []
        for slot, clip in zip(slots, clips):
            preparation = self.prepared.pop(slot, None)
            if preparation is not None and preparation[0] == clip:
                if not preparation[1].triggered:
                    yield preparation[1]
            else:
                unprepared.append(clip)
        fixed = self.costs.reset_fixed_s + len(slots) * self.costs.reset_per_slot_s
        compute = fixed * self.costs.reset_compute_share  # the env's reset, after the waits (the servicer's order)
        fixed -= compute
        if fixed > 0:
            if self.engine is not None:
                yield self.engine.acquire()
            if self.turns is not None:
                yield from self.turns.fixed_part()
            yield self.sim.timeout(fixed)
            if self.turns is not None:
                self.turns.fixed_part_done()
            if self.engine is not None:
                self.engine.release()
        maps = [self.run.map_of(clip) for clip in unprepared]
        seconds = self._price(maps)  # against the cache as it is once the fixed part is done
        if seconds > 0:
            if self.channel is not None:
                yield self.channel.acquire()
            yield self.sim.timeout(seconds)
            if self.channel is not None:
                self.channel.release()
        self._remember(maps)
        yield from _hold(self.sim, self.thread, compute)
        yield from self.run.receive()

    def prepare(self, slot: int, clip: int) -> None:
        if not self.costs.prepare:
            return
        old = self.prepared.get(slot)
        if old is not None and old[0] == clip:
            return
        self.prepared[slot] = (clip, self.sim.process(self._load_ahead(clip)))

    def _load_ahead(self, clip: int) -> Process:
        if self.channel is not None:
            yield self.channel.acquire()
        m = self.run.map_of(clip)
        seconds = self._price([m])
        if seconds > 0:
            self.background_loads += 1
            yield self.sim.timeout(seconds)
            self.background_loads -= 1
        if self.channel is not None:
            self.channel.release()
        self._remember([m])

    def _price(self, maps: list[int]) -> float:
        """The loads of one call (sim_server/cost_model.py `map_load_s`), counted in the tally.
        Map -1 (no catalog): cached with probability hit_rate."""
        seen: set[int] = set()
        loads = []
        tally = self.run.tally
        for m in maps:
            if m < 0:
                cached = self.run.rng.random() < (self.costs.hit_rate or 0.0)
            else:
                cached = m in seen or m in self.cache
                seen.add(m)
            tally.map_cache_hits += cached
            tally.map_loads += not cached
            loads.append(self.costs.map_load_cached_s if cached else self.costs.map_load_s)
        if not loads:
            return 0.0
        return sum(loads) if self.costs.loads_shared else max(loads)

    def _remember(self, maps: list[int]) -> None:
        size = self.costs.map_cache_size
        for m in maps:
            if m < 0:
                continue
            if m in self.cache:
                self.cache.move_to_end(m)
            elif size > 0:
                self.cache[m] = None
                while len(self.cache) > size:
                    self.cache.popitem(last=False)


class _InferenceBatcher:
    """ver.py's: the slots that ask in the same turn of the loop share one forward pass."""

    def __init__(self, run: _Run) -> None:
        self.run = run
        self.pending: list[Event] = []

    def act(self) -> Event:
        event = self.run.sim.event()
        if not self.pending:
            self.run.sim.soon(self._flush)  # after every slot already woken at this moment has asked
        self.pending.append(event)
        return event

    def _flush(self) -> None:
        pending, self.pending = self.pending, []
        self.run.sim.process(self._pass(pending))

    def _pass(self, pending: list[Event]) -> Process:
        yield from self.run.infer(len(pending))
        for event in pending:
            event.succeed()


class _StepBatcher:
    """ver.py's StepBatcher: a server's queued steps go as one call once every active slot of it
    has queued one, or VER_GATHER_S after the first."""

    def __init__(self, run: _Run) -> None:
        self.run = run
        self.pending: dict[int, list[Event]] = {}
        self.active: dict[int, set[int]] = {}
        self.timers: dict[int, object] = {}

    def enter(self, slot: int) -> None:
        self.active.setdefault(int(self.run.slot_server[slot]), set()).add(slot)

    def leave(self, slot: int) -> None:
        server = int(self.run.slot_server[slot])
        self.active.get(server, set()).discard(slot)
        self._flush_if_all_in(server)

    def step(self, slot: int) -> Event:
        sim = self.run.sim
        event = sim.event()
        server = int(self.run.slot_server[slot])
        self.active.setdefault(server, set()).add(slot)
        queue = self.pending.setdefault(server, [])
        queue.append(event)
        if len(queue) == 1:
            token = self.timers[server] = object()
            sim.call_at(sim.now + VER_GATHER_S, self._timer, server, token)
        self._flush_if_all_in(server)
        return event

    def _timer(self, server: int, token: object) -> None:
        if self.timers.get(server) is token:
            self._flush(server)

    def _flush_if_all_in(self, server: int) -> None:
        queue = self.pending.get(server)
        if queue and len(queue) >= len(self.active.get(server, ())):
            self._flush(server)

    def _flush(self, server: int) -> None:
        queue = self.pending.pop(server, [])
        self.timers.pop(server, None)
        if queue:
            self.run.tally.step_calls += 1
            self.run.sim.process(self._call(server, queue))

    def _call(self, server: int, queue: list[Event]) -> Process:
        yield from self.run.servers[server].step(len(queue))
        for event in queue:
            event.succeed()


class _SlotEpisodes:
    """Each slot's episode lengths, one stream a slot: the slot's k-th episode has the same length
    whatever the mode, alpha or timing that brought it to its k-th reset (common random numbers).
    Two settings played on one seed then differ by their rules alone, not by which draw fell to
    which slot, and a comparison between them (best_alpha's curve) is paired: drawn from one shared
    stream in reset order, the curve's points for one seed spread by 15% or more around their means
    and as much against each other, so most of a decision's differences were the draws'."""

    BLOCK = 64  # lengths drawn at once per slot (a draw per reset would cost a weighted choice each)

    def __init__(self, lengths: EpisodeLengths, slots: int, seed: int) -> None:
        self.lengths = lengths
        self.rngs = [np.random.default_rng([seed, slot]) for slot in range(slots)]
        self.buffers = [np.zeros(0, dtype=np.int64) for _ in range(slots)]
        self.used = np.zeros(slots, dtype=np.int64)
        # The episode a steady start catches in progress, per slot, from its own stream too.
        steady = [lengths.sample_in_progress(np.random.default_rng([seed, slot, 1]), 1) for slot in range(slots)]
        self.caught_total = np.array([t[0] for t, _ in steady], dtype=np.int64)
        self.caught_age = np.array([a[0] for _, a in steady], dtype=np.int64)

    def next(self, slots: np.ndarray) -> np.ndarray:
        """The next episode length of each of these slots."""
        out = np.empty(slots.size, dtype=np.int64)
        for i, slot in enumerate(slots.tolist()):
            if self.used[slot] == self.buffers[slot].size:
                self.buffers[slot] = self.lengths.sample(self.rngs[slot], self.BLOCK)
                self.used[slot] = 0
            out[i] = self.buffers[slot][self.used[slot]]
            self.used[slot] += 1
        return out

    def in_progress(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(whole length, steps already taken) of the episode each slot is caught in at a steady start."""
        return self.caught_total[slots], self.caught_age[slots]


class _Run:
    """One mode on one workload, from a common start, in simulated time."""

    def __init__(self, workload: Workload, settings: ModeSettings, seed: int) -> None:
        if settings.locality and workload.catalog is None:
            raise ValueError("locality needs a Catalog: which map each clip plays on")
        self.workload, self.settings = workload, settings
        self.sim = Sim()
        self.rng = np.random.default_rng(seed)
        self.episodes = _SlotEpisodes(workload.lengths, workload.num_slots, seed)
        self.cpu = Lock(self.sim)  # the broker's one thread: forward passes take turns on it
        # A call's thread parts and its wait (`send`), the same for every call of the run.
        sent = self.call_sent_s = workload.call_cpu_s - workload.call_receive_cpu_s
        received = self.call_received_s = workload.call_receive_cpu_s
        servers = workload.servers
        self.call_wait_s = workload.call_s - max(servers * sent + received, sent + servers * received)
        self.servers = [_Server(self, workload.server_costs(i)) for i in range(workload.servers)]
        n = workload.num_slots
        self.slot_server = np.repeat(np.arange(workload.servers), workload.slots_per_server)
        self.slot_local = np.tile(np.arange(workload.slots_per_server), workload.servers)
        self.live = np.zeros(n, dtype=bool)
        self.left = np.zeros(n, dtype=np.int64)  # steps left in each live episode (drawn at its reset)
        self.episode_len = np.zeros(n, dtype=np.int64)
        self.next_clip = np.full(n, -1, dtype=np.int64)  # prefetch: the clip dealt ahead and being prepared
        self.in_progress = np.zeros(n, dtype=bool)  # steady start: the slot's first episode is caught mid-way
        self.tally = _Tally()
        catalog = workload.catalog
        self.episodes_dealt = 0
        if catalog is None:
            self.dealer = None
        else:
            maps = np.asarray(catalog.clip_map_ids, dtype=np.int64)
            self.clip_maps = maps
            locality = None
            if settings.locality:
                cache = {i: workload.server_costs(i).map_cache_size for i in range(workload.servers)}
                locality = MapLocality(maps, cache, max_repeat=catalog.locality_max_repeat)
            self.dealer = ClipDealer(maps.size, holdout_every=catalog.holdout_every, seed=seed, locality=locality)
        if settings.mode == "ver":
            self.rule = None
            self.driven = np.arange(n)
        else:
            self.rule = LOCKSTEP_RULES[settings.mode].configured(
                alpha=settings.alpha, t_max=settings.t_max, truncation=settings.truncation
            )
            self.driven = self.rule.drives(np.arange(n))
        self.position = np.full(n, -1, dtype=np.int64)  # a slot's position among the driven ones
        self.position[self.driven] = np.arange(self.driven.size)

    # -- the pieces every mode shares -----------------------------------------------------------

    def map_of(self, clip: int) -> int:
        """The clip's map; -1 without a catalog (its cache hit is then drawn at hit_rate)."""
        return -1 if self.dealer is None else int(self.clip_maps[clip])

    def infer(self, batch: int) -> Process:
        yield from self.busy(self.workload.inference_s + batch * self.workload.inference_per_obs_s)

    def busy(self, seconds: float) -> Process:
        """`seconds` of work on the broker's one thread, in turn with the other work on it."""
        yield from _hold(self.sim, self.cpu, seconds)

    def send(self) -> Process:
        """A call's broker part before the server's: its send's turn on the thread, then the wait that
        makes a lock-step row of one call per server cost `call_s` with every receive after it. The
        thread's part of such a row is the sends, then the last receive, or the first send, then every
        receive, whichever is the longer (the receives queue when each is longer than a send)."""
        yield from self.busy(self.call_sent_s)
        if self.call_wait_s > 0:
            yield self.call_wait_s

    def receive(self) -> Process:
        """A call's broker part once the server has answered: its receive's turn on the thread."""
        yield from self.busy(self.call_received_s)

    def transport(self) -> Process:
        """A call whose server does nothing the model times (Prepare: its load runs in the background)."""
        yield from self.send()
        yield from self.receive()

    def _deal(self, slots: np.ndarray) -> np.ndarray:
        if self.dealer is None:  # clips without maps: each episode a clip of its own
            self.episodes_dealt += slots.size
            return np.arange(self.episodes_dealt - slots.size, self.episodes_dealt, dtype=np.int64)
        clips, _ = self.dealer.deal(slots.size, self.slot_server[slots])
        return clips

    def _by_server(self, slots: np.ndarray) -> dict[int, np.ndarray]:
        servers = self.slot_server[slots]
        return {int(s): slots[servers == s] for s in np.unique(servers)}

    def reset(self, slots: np.ndarray, *, batched: bool) -> Process:
        """lockstep.py `_reset`: the slots' next clips (those dealt ahead, the others dealt now), one
        Reset call per server (batched) or per slot, all at once; each slot then starts an episode."""
        if slots.size == 0:
            return
        clips = self.next_clip[slots].copy()
        fresh = clips < 0
        if fresh.any():
            clips[fresh] = self._deal(slots[fresh])
        self.next_clip[slots] = -1
        clip_of = dict(zip(slots.tolist(), clips.tolist()))
        calls = []
        for server, group in self._by_server(slots).items():
            local, theirs = self.slot_local[group].tolist(), [clip_of[g] for g in group.tolist()]
            parts = [(local, theirs)] if batched else [([j], [c]) for j, c in zip(local, theirs)]
            calls += [self.sim.process(self.servers[server].reset(a, b)) for a, b in parts]
        self.tally.reset_calls += len(calls)
        yield self.sim.all_of(calls)
        self.live[slots] = True
        self.episode_len[slots] = 0
        self.left[slots] = self.episodes.next(slots)
        caught = slots[self.in_progress[slots]]
        if caught.size:
            total, age = self.episodes.in_progress(caught)
            self.episode_len[caught], self.left[caught] = age, total - age
            self.in_progress[caught] = False
        self.tally.slot_resets += slots.size

    def prepare_next(self, slots: np.ndarray) -> Process:
        """Prefetch: deal these slots' next clips now; their servers load them in the background."""
        if not self.settings.prefetch:
            return
        free = slots[self.next_clip[slots] < 0]
        if free.size == 0:
            return
        self.next_clip[free] = self._deal(free)
        for s in free.tolist():
            self.servers[int(self.slot_server[s])].prepare(int(self.slot_local[s]), int(self.next_clip[s]))
        yield from self.transport()

    def step(self, slots: np.ndarray) -> Process:
        """One Step call per server for these slots, all at once."""
        calls = [self.sim.process(self.servers[s].step(g.size)) for s, g in self._by_server(slots).items()]
        self.tally.step_calls += len(calls)
        yield self.sim.all_of(calls)

    def apply(self, slots: np.ndarray) -> np.ndarray:
        """These slots stepped: count them; the ones whose episode ended are no longer live."""
        self.episode_len[slots] += 1
        self.left[slots] -= 1
        self.tally.valid += slots.size
        ended = slots[self.left[slots] <= 0]
        self.tally.lengths += self.episode_len[ended].tolist()
        self.live[ended] = False
        return ended

    # -- the modes ------------------------------------------------------------------------------

    def iteration(self, target: int) -> Process:
        if self.rule is None:
            yield from self._ver(target)
        elif self.rule.rounds:
            yield from self._rounds(target)
        else:
            yield from self._plain(target)
        yield from self.infer(int(self.live[self.driven].sum()))  # the batch's bootstrap values: one pass

    def _plain(self, target: int) -> Process:
        """sc, autoreset (lockstep.py `sample` without rounds)."""
        slots = self.driven
        yield from self._refill(slots)
        while True:
            acting = slots[self.live[slots]]
            yield from self.infer(acting.size)
            yield from self.step(acting)
            self.tally.transitions += slots.size
            self.apply(acting)
            if self.tally.valid >= target:
                return
            yield from self._refill(slots)

    def _refill(self, slots: np.ndarray) -> Process:
        idle = slots[~self.live[slots]]
        yield from self.reset(idle, batched=False)
        yield from self.prepare_next(idle)

    def _rounds(self, target: int) -> Process:
        """sgr, fast (lockstep.py `_sample_rounds`, rounds.py `_lockstep`)."""
        rule, slots = self.rule, self.driven
        groups = self._by_server(slots)
        while True:
            fresh = slots[~self.live[slots]] if rule.carries else slots
            yield from self.reset(fresh, batched=True)
            yield from self.prepare_next(fresh)
            if fresh.size or not rule.carries:
                self.tally.global_resets += 1
            members = np.flatnonzero(self.live[slots])  # positions in `slots`
            done = np.zeros(slots.size, dtype=bool)  # by position: ended (this round)
            steps = 0
            while True:
                acting = slots[self.live[slots]]
                if acting.size == 0:
                    break
                for group in groups.values():
                    acting_here = group[self.live[group]]
                    if acting_here.size:
                        yield from self.infer(acting_here.size)
                yield from self.step(acting)
                self.tally.transitions += slots.size
                ended_at = self.position[self.apply(acting)]
                done[ended_at] = True
                steps += 1
                if rule.round_over(ended=ended_at, live=self.live[slots], done=done[members], steps=steps):
                    break
            if not rule.carries:  # cut: the length reached is recorded, as the sampler records it
                cut = slots[self.live[slots]]
                self.tally.lengths += self.episode_len[cut].tolist()
                self.live[cut] = False
            yield from self.busy(self.workload.round_s)
            if self.tally.valid >= target:
                return

    def _ver(self, target: int) -> Process:
        """ver.py `sample`: every slot on its own, inference and steps batched over the slots ready."""
        budget, in_flight, waiting = [target], [0], []
        inference = _InferenceBatcher(self)
        batcher = _StepBatcher(self) if self.settings.ver_step_batching else None
        if batcher is not None:  # every slot is about to step: the first call waits for its server's others
            for s in self.driven.tolist():
                batcher.enter(s)

        def leave(slot: int) -> None:
            if batcher is not None:
                batcher.leave(slot)

        def step_done() -> None:
            for event in waiting:
                event.succeed()
            waiting.clear()

        def slot_loop(s: int) -> Process:
            one = np.array([s])
            while True:
                if budget[0] <= 0:
                    leave(s)
                    if in_flight[0] == 0:
                        return
                    event = self.sim.event()
                    waiting.append(event)
                    yield event
                    continue
                if not self.live[s]:
                    leave(s)
                    yield from self.reset(one, batched=False)
                    yield from self.prepare_next(one)
                if budget[0] <= 0:
                    continue
                budget[0] -= 1
                in_flight[0] += 1
                yield inference.act()
                if batcher is not None:
                    yield batcher.step(s)
                else:
                    yield from self.step(one)
                in_flight[0] -= 1
                step_done()
                yield from self.busy(self.workload.ver_slot_s)  # the slot's coroutine takes its answer
                self.tally.transitions += 1
                self.apply(one)

        yield self.sim.all_of([self.sim.process(slot_loop(int(s))) for s in self.driven])

    # -- the whole run ----------------------------------------------------------------------------

    def measure(self, horizon: Horizon) -> list[_Tally]:
        measured: list[_Tally] = []
        self.in_progress[:] = horizon.steady_start

        def main() -> Process:
            for i in range(horizon.warmup_iterations + horizon.iterations):
                warm = i < horizon.warmup_iterations
                self.tally = _Tally()
                started = self.sim.now
                target = horizon.warmup_samples or horizon.samples_per_iteration
                yield from self.iteration(target if warm else horizon.samples_per_iteration)
                self.tally.wall_s = self.sim.now - started
                if not warm:
                    measured.append(self.tally)

        self.sim.run(until=self.sim.process(main()))
        return measured


def predict(
    workload: Workload, settings: ModeSettings, horizon: Horizon | None = None, *, seed: int = 0, seeds: int = 1
) -> Prediction:
    """The figures `settings` would give on `workload` (module docstring); the same for the same seed.

    With `seeds` > 1 the horizon is played on seeds `seed`, `seed + 1`, ... and their iterations
    pooled (valid over wall, both summed): the expected figure of the horizon rather than one draw
    of it. One draw is as noisy as one measurement: sgr at 10 clips ends a round at the first of 10
    episodes to end, some 25 rounds in 2,048 transitions, and one seed's figure moved by 38% (the
    standard deviation over 8 seeds, `calibrated`, the trained policy)."""
    if seeds < 1:
        raise ValueError(f"seeds={seeds!r}: give >= 1")
    horizon = horizon or Horizon()
    tallies = [t for k in range(seeds) for t in _Run(workload, settings, seed + k).measure(horizon)]
    valid = sum(t.valid for t in tallies)
    transitions = sum(t.transitions for t in tallies)
    wall = sum(t.wall_s for t in tallies)
    lengths = [x for t in tallies for x in t.lengths]
    priced = sum(t.map_loads + t.map_cache_hits for t in tallies)

    def per_1k(count: int) -> float:
        return 1000.0 * count / valid

    return Prediction(
        label=settings.label,
        settings=settings,
        effective_throughput=valid / wall if wall > 0 else math.inf,
        raw_throughput=transitions / wall if wall > 0 else math.inf,
        eta=valid / transitions,
        slot_resets_per_1k_valid=per_1k(sum(t.slot_resets for t in tallies)),
        global_resets_per_1k_valid=per_1k(sum(t.global_resets for t in tallies)),
        reset_calls_per_1k_valid=per_1k(sum(t.reset_calls for t in tallies)),
        step_calls_per_valid=sum(t.step_calls for t in tallies) / valid,
        episode_length_mean=float(np.mean(lengths)) if lengths else math.nan,
        cache_hit_rate=sum(t.map_cache_hits for t in tallies) / priced if priced else math.nan,
        valid=valid,
        transitions=transitions,
        wall_s=wall,
    )


def rank(
    workload: Workload,
    candidates: list[ModeSettings],
    horizon: Horizon | None = None,
    *,
    seed: int = 0,
    seeds: int = 1,
) -> list[Prediction]:
    """Every candidate predicted (on the same seeds: `predict`), best effective throughput first."""
    predictions = [predict(workload, c, horizon, seed=seed, seeds=seeds) for c in candidates]
    return sorted(predictions, key=lambda p: -p.effective_throughput)


# The alphas `best_alpha` tries by default: DPSA's whole range, finer where rounds end early.
ALPHA_GRID: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def best_alpha(
    workload: Workload,
    *,
    alphas: tuple[float, ...] = ALPHA_GRID,
    t_max: int = 1000,
    truncation: str = "carry",
    prefetch: bool = False,
    locality: bool = False,
    horizon: Horizon | None = None,
    seed: int = 0,
    seeds: int = 1,
) -> tuple[float, list[Prediction]]:
    """The alpha of `alphas` (the bounds a user set are the grid's ends) whose `fast` the model
    predicts fastest, and the prediction of each, in the grid's order. Every alpha is played on the
    same seed, so the lengths each draws are the same and the comparison is paired; a tie goes to
    the first."""
    if not alphas:
        raise ValueError("alphas is empty: give at least one alpha in (0, 1]")
    predictions = [
        predict(
            workload,
            ModeSettings("fast", alpha=a, t_max=t_max, truncation=truncation, prefetch=prefetch, locality=locality),
            horizon,
            seed=seed,
            seeds=seeds,
        )
        for a in alphas
    ]
    best = max(range(len(alphas)), key=lambda i: (predictions[i].effective_throughput, -i))
    return alphas[best], predictions

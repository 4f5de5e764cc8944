"""The seam between the samplers and the simulators: what a sampler needs of a pool of slots.

A sampler (broker/samplers/) and the evaluation (broker/evaluate.py) drive globally numbered
slots 0..N-1 that live on one or more simulator servers. They need only this of the pool:

- its spaces and catalog (`observation_space`, `action_space`, `num_clips`);
- per-server grouping (`slot_server`, `by_server`): lock-step rounds act and step server by
  server, the dealer deals per server, VER batches a server's ready slots into one call;
- `up_mask` and `readmit_due`: which slots can be stepped now, and a chance for a failed server
  to come back (its slots then need a Reset);
- `step`, `reset` and `prepare`, answering `PoolStep` and `PoolReset`: a slot whose server
  failed is marked `failed` and holds zeros, never raises.

Two pools implement it: `SimulatorPool` (broker/pool.py), the simulator servers over gRPC or
their local step socket, with membership, deadlines, answer checks and re-admission; and
`InProcessPool` (broker/in_process.py), `Simulator`s in this event loop without transport, for
tests of sampling semantics and for a training loop in one process
(examples/train_in_process.py). `SlotNumbering` is the part both share: the global numbering of
slots over servers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from fast.spaces import SpaceSpec
    from fast.v1 import simulator_pb2 as pb
    from sim_server.client import StepReply

log = logging.getLogger("fast.broker.pool")


@dataclass
class PoolStep:
    """Results of one step of k global slots, in the order asked."""

    observations: np.ndarray  # [k, *obs_shape]; zeros where failed
    rewards: np.ndarray  # [k] float32
    terminated: np.ndarray  # [k] bool
    truncated: np.ndarray  # [k] bool
    failed: np.ndarray  # [k] bool: the slot's server failed; nothing of it is valid
    episodes: dict[int, pb.EpisodeSummary] = field(default_factory=dict)  # global slot -> summary
    server_s: float = 0.0  # slowest call's server-side time (compute + emulated + queued)
    compute_s: float = 0.0  # the answered calls' own compute (their env's step), summed

    @classmethod
    def zeros(cls, k: int, space: SpaceSpec) -> PoolStep:
        """Room for k slots' results, every one zero until its server answers."""
        return cls(
            observations=np.zeros((k, *space.shape), dtype=space.dtype),
            rewards=np.zeros(k, dtype=np.float32),
            terminated=np.zeros(k, dtype=bool),
            truncated=np.zeros(k, dtype=bool),
            failed=np.zeros(k, dtype=bool),
        )

    def take(self, positions: np.ndarray, reply: StepReply, timing, slot_offset: int, counters: PoolCounters) -> None:
        """One server's checked Step answer for `positions` of the call (its first slot is global
        `slot_offset`): results in place, its time and the pool's counters added."""
        self.observations[positions] = reply.observations
        self.rewards[positions] = reply.rewards
        self.terminated[positions] = reply.terminated
        self.truncated[positions] = reply.truncated
        for episode in reply.episodes:
            self.episodes[slot_offset + episode.slot_id] = episode
        self.server_s = max(self.server_s, timing.compute_s + timing.emulated_s + timing.queued_s)
        self.compute_s += timing.compute_s
        counters.step_calls += 1
        counters.step_server_s += timing.compute_s + timing.emulated_s
        counters.step_compute_s += timing.compute_s


@dataclass
class PoolReset:
    observations: np.ndarray  # [k, *obs_shape]; zeros where failed
    failed: np.ndarray  # [k] bool
    server_s: float = 0.0
    compute_s: float = 0.0  # the answered calls' own compute (their env's reset), summed
    calls: int = 0  # Reset calls sent
    call_walls: list[tuple[int, float]] = field(default_factory=list)  # each answered call: (slots, wall s)

    @classmethod
    def zeros(cls, k: int, space: SpaceSpec) -> PoolReset:
        return cls(observations=np.zeros((k, *space.shape), dtype=space.dtype), failed=np.zeros(k, dtype=bool))

    def take(self, positions: np.ndarray, observations: np.ndarray, timing, counters: PoolCounters) -> None:
        """One checked Reset answer for `positions` of the call: observations in place, its time
        and the pool's counters (reset slots, map loads and hits, preparations used) added."""
        self.observations[positions] = observations
        self.server_s = max(self.server_s, timing.compute_s + timing.emulated_s + timing.queued_s)
        self.compute_s += timing.compute_s
        counters.reset_calls += 1
        counters.reset_slots += positions.size
        counters.map_loads += timing.map_loads
        counters.map_cache_hits += timing.map_cache_hits
        counters.prepared += timing.prepared


@dataclass
class PoolCounters:
    """What the pool's answered calls add up to since it started: a benchmark takes the difference
    around a measurement (the step latency really paid, the map cache's hit rate)."""

    step_calls: int = 0
    step_server_s: float = 0.0  # compute + emulated of each answered Step call, summed (queueing apart)
    step_compute_s: float = 0.0  # of which the servers' own compute (their env's step)
    reset_calls: int = 0
    reset_slots: int = 0
    map_loads: int = 0  # reset slots that loaded their map from scratch (servers that count them)
    map_cache_hits: int = 0
    prepare_calls: int = 0  # Prepare calls answered
    prepared: int = 0  # reset slots that started from a preparation

    def since(self, earlier: PoolCounters) -> PoolCounters:
        return PoolCounters(**{k: getattr(self, k) - getattr(earlier, k) for k in self.__dataclass_fields__})

    def plus(self, other: PoolCounters) -> PoolCounters:
        return PoolCounters(**{k: getattr(self, k) + getattr(other, k) for k in self.__dataclass_fields__})


@dataclass(frozen=True)
class PoolTimeouts:
    """Every call's deadline, and how soon a failed server is tried again (doubling up to the max)."""

    step_s: float = 5.0
    reset_s: float = 30.0
    describe_s: float = 5.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 10.0


class SlotServer(Protocol):
    """What a sampler reads of one server: whether it is up, and why not (for its errors)."""

    address: str
    up: bool
    dropped: bool  # never coming back in this run: waiting for it cannot help
    last_error: str


def count_bad_answer(server, problem: str, max_bad_answers: int, mark_down: Callable[[str], object]) -> None:
    """A server answered against the contract (broker/answers.py): a fault like a crash, `mark_down`
    with why, and counted towards dropping it for the run after `max_bad_answers` in a row (a
    good Step answer sets `server.bad_answers` back to 0). Answers of calls that were in flight
    when it went down are not counted again: one fault, one count, however many concurrent calls
    (VER's) it spoiled."""
    if not server.up:
        return
    server.bad_answers += 1
    mark_down(f"bad answer ({server.bad_answers} in a row): {problem}")
    if server.bad_answers >= max_bad_answers:
        server.dropped = True
        server.last_error = (
            f"dropped after {server.bad_answers} bad answers in a row and is not re-admitted in this run "
            f"(fix it, then start a new run); the last: {problem}"
        )
        log.error("simulator %s %s", server.address, server.last_error)


class SlotPool(Protocol):
    """What samplers and the evaluation need of the slots they drive (module docstring)."""

    observation_space: SpaceSpec
    action_space: SpaceSpec
    num_clips: int
    servers: Sequence[SlotServer]
    slot_server: np.ndarray  # [N] index into `servers` of each global slot

    @property
    def num_slots(self) -> int: ...

    def up_mask(self) -> np.ndarray:
        """[N] bool: the slot's server is up."""
        ...

    def by_server(self, slots: np.ndarray) -> dict[int, np.ndarray]:
        """Positions into `slots`, grouped by server (in server order)."""
        ...

    async def readmit_due(self) -> list:
        """Try to bring back the failed servers whose backoff elapsed; those that came back."""
        ...

    async def step(self, slots: np.ndarray, env_actions: np.ndarray, *, unary: bool = False) -> PoolStep:
        """Step global `slots`; `unary`: the caller steps slots of one server concurrently (VER)."""
        ...

    async def reset(self, slots: np.ndarray, clips: np.ndarray, seeds: np.ndarray, *, batched: bool) -> PoolReset:
        """Reset global `slots` onto `clips`; `batched`: one call per server, else one per slot."""
        ...

    async def prepare(self, slots: np.ndarray, clips: np.ndarray, seeds: np.ndarray) -> None:
        """A hint: start loading the clips these slots reset onto next; never a fault."""
        ...


class SlotNumbering:
    """Global slot ids over a list of servers (each with `up`): the part of a pool every kind shares.

    Slots are numbered 0..N-1 across servers in their order; `slot_server` and `slot_local` map a
    global slot to its server's index and its local slot id there.
    """

    servers: Sequence[SlotServer]

    def __init__(self) -> None:
        self.slot_server = np.zeros(0, dtype=np.int64)  # [N] server index of each global slot
        self.slot_local = np.zeros(0, dtype=np.int64)  # [N] local slot id on its server

    @property
    def num_slots(self) -> int:
        return int(self.slot_server.size)

    def _number(self, slots_per_server: Sequence[int]) -> None:
        """The slot maps for servers of these slot counts, in order."""
        self.slot_server = np.concatenate(
            [np.zeros(0, np.int64)] + [np.full(n, s, dtype=np.int64) for s, n in enumerate(slots_per_server)]
        )
        self.slot_local = np.concatenate(
            [np.zeros(0, np.int64)] + [np.arange(n, dtype=np.int64) for n in slots_per_server]
        )

    def up_mask(self) -> np.ndarray:
        """[N] bool: the slot's server is up."""
        up = np.fromiter((server.up for server in self.servers), dtype=bool, count=len(self.servers))
        return up[self.slot_server]  # a few servers looked at, not every slot

    def by_server(self, slots: np.ndarray) -> dict[int, np.ndarray]:
        """Positions into `slots`, grouped by the server of each slot."""
        owners = self.slot_server[slots]
        # One comparison per server (a handful), not np.unique's sort of every slot; servers in order.
        groups = {s: np.flatnonzero(owners == s) for s in range(len(self.servers))}
        return {s: positions for s, positions in groups.items() if positions.size}

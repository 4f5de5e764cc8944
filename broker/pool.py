"""The simulator servers a broker drives, as one pool of globally numbered slots.

Slots are numbered 0..N-1 across servers in the order servers joined. Every call has a
deadline. A server whose call fails or times out is marked down: the caller learns which
slots failed (their results are zeros and must be masked), and the server is retried with
exponential backoff by `readmit_due`, which re-admits it when it answers Describe with the
same spaces again. Its slots then need a Reset before they step. No wait is unbounded.

A server that answers, but badly (broker/answers.py: an observation of the wrong shape, a NaN
reward, a slot both terminated and truncated, ...), is faulted the same way: nothing of that
answer is used. After `max_bad_answers` bad answers with no good Step answer between them it is
dropped: never re-admitted in this run (RegisterSimulator refuses it too), since a server that
keeps breaking the contract would keep costing a step and a reset each time.

A server leaves only between iterations (`remove`, after a control call detached it): the
global slot ids of the servers after it move down, so the sampler is rebuilt, as when one joins.

Each server is driven as its Describe's Capabilities allow, server by server (a pool may mix):
one that has no StepStream is stepped with unary Step calls (broker/transport.py chooses how a
step reaches a server), and one without batched resets gets one Reset call per slot where the
mode would send one call for several (at most `UNBATCHED_RESET_CONCURRENCY` of them in flight
to it at a time). Each such fallback is logged once per server and shown in its status.

The samplers see this pool only through the seam of broker/slots.py (`SlotPool`), which an
in-process pool implements too (broker/in_process.py). Simulator addresses are parsed and
resolved in fast/addresses.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import grpc
import numpy as np

from broker import answers
from broker.slots import PoolCounters, PoolReset, PoolStep, PoolTimeouts, SlotNumbering, count_bad_answer
from broker.transport import StepTransport
from fast.quoting import shorten
from fast.rpc import Credentials
from fast.spaces import SpaceSpec, space_mismatch
from fast.tensor import TensorError
from fast.v1 import simulator_pb2 as pb
from sim_server.client import LocalStepStream, ServerDescription, SimulatorClient, StepStream

log = logging.getLogger("fast.broker.pool")

# A call that fails in any of these ways means the server is gone, stalled or broken: its
# slots are lost for now and the server is retried. (StepStream raises the status that finished
# the stream, not grpc's InvalidStateError, which stays here as a last resort.)
_FAULTS = (grpc.RpcError, asyncio.TimeoutError, asyncio.InvalidStateError, ConnectionError, OSError)
T = TypeVar("T")
# Weight of the newest call in a server's latency moving averages (status only, never a decision).
LATENCY_EMA_WEIGHT = 0.1
# Reset calls in flight at once to one server that resets one slot per call, when the mode would
# have sent it one call for several slots. Not unbounded: a server whose reset engine is exclusive
# queues them, and a call's deadline runs from when it is sent, so a long queue would spend the
# deadlines of the calls at its back (and mark a healthy server down). Not 1: concurrency overlaps
# the round trips and lets a server that resets in parallel (several workers) do so.
UNBATCHED_RESET_CONCURRENCY = 4


@dataclass
class ServerHandle:
    index: int
    address: str
    client: SimulatorClient
    env_id: str
    num_slots: int
    slot_offset: int  # its local slot j is global slot slot_offset + j
    up: bool = True
    faults: int = 0
    readmissions: int = 0
    last_error: str = ""
    retry_at: float = 0.0
    backoff_s: float = 0.0
    stream: StepStream | LocalStepStream | None = None
    bad_answers: int = 0  # bad answers since its last good Step answer
    dropped: bool = False  # too many bad answers: never re-admitted in this run
    readmitting: bool = False  # a readmission attempt is in flight
    draining: bool = False  # detached by a control call: removed at the next iteration boundary
    step_latency_s: float = 0.0  # moving average of its answered Step calls' wall seconds; 0 before the first
    reset_latency_s: float = 0.0  # the same for its Reset calls
    # Its Describe's Capabilities (the last one it answered): StepStream is implemented; Reset takes several slots.
    streaming_step: bool = True
    batched_reset: bool = True
    cost_model: pb.CostModel | None = None  # the emulated costs its Describe reported
    prefetch: bool = False  # Prepare is served (Capabilities.prefetch)
    # Its local step socket (Capabilities.local_step_socket), "" when it has none or it could not be
    # opened from here; its stream then runs over gRPC.
    local_step_socket: str = ""
    # Idle connections to that socket for unary callers (VER steps a server with several calls at once).
    local_spare: list[LocalStepStream] = field(default_factory=list)


class SimulatorPool(SlotNumbering):
    """The simulator servers over gRPC (or their local step socket): a `SlotPool` (broker/slots.py)."""

    def __init__(
        self,
        timeouts: PoolTimeouts | None = None,
        *,
        use_stream: bool = True,
        use_local_step: bool = True,
        credentials: Credentials | None = None,
        max_bad_answers: int = 5,
    ) -> None:
        super().__init__()
        self.timeouts = timeouts or PoolTimeouts()
        self.max_bad_answers = max_bad_answers  # bad answers in a row that drop a server for good
        # What every call to a simulator carries: the run token (the environment's when None), TLS.
        self.credentials = credentials or Credentials.from_env()
        self.transport = StepTransport(
            use_stream=use_stream, use_local_step=use_local_step, step_timeout_s=self.timeouts.step_s
        )
        self.servers: list[ServerHandle] = []
        self.observation_space: SpaceSpec | None = None
        self.action_space: SpaceSpec | None = None
        self.num_clips = 0
        # [num_clips] map id of each clip, from the first server's Describe; empty when it did not say.
        self.clip_map_ids = np.zeros(0, dtype=np.int64)
        self.counters = PoolCounters()
        # Channels a re-admission replaced, closing once the calls still on them end (_retire).
        self._retiring: dict[SimulatorClient, asyncio.Task] = {}

    @property
    def use_stream(self) -> bool:
        return self.transport.use_stream

    @property
    def use_local_step(self) -> bool:
        return self.transport.use_local_step

    async def add(self, address: str) -> ServerHandle:
        """Connect to a server and give it the next global slot ids; its spaces must match the pool's."""
        client = SimulatorClient(address, timeout_s=self.timeouts.describe_s, credentials=self.credentials)
        try:
            desc = await client.describe()
        except _FAULTS as exc:
            await client.close()
            raise ConnectionError(f"simulator {address} did not answer Describe: {_describe_error(exc)}") from None
        except TensorError as exc:  # spaces that do not decode, or that no one could use
            await client.close()
            raise ValueError(f"simulator {address} answered Describe badly: {exc}") from None
        refusal = self.refusal(address, desc)
        if refusal:
            await client.close()
            raise ValueError(refusal)
        if self.observation_space is None:  # the first server sets the pool's spaces
            self.observation_space, self.action_space = desc.observation_space, desc.action_space
            self.num_clips = desc.num_clips
            self.clip_map_ids = desc.clip_map_ids
        handle = ServerHandle(len(self.servers), address, client, desc.env_id, desc.num_slots, self.num_slots)
        _take_capabilities(handle, desc, first=True)
        self.servers.append(handle)
        self._number([s.num_slots for s in self.servers])
        return handle

    def refusal(self, address: str, desc: ServerDescription) -> str:
        """ "" when the server at `address`, described by `desc`, may join the pool; else why it may not.

        The one admission rule: `add` applies it, and so does the broker's RegisterSimulator, so
        a server the API accepts is never refused when it joins.
        """
        dropped = next((s for s in self.servers if s.address == address and s.dropped), None)
        if dropped is not None:
            return f"simulator {address} was {dropped.last_error}"
        problem = answers.description_problem(desc)
        if problem:
            return f"simulator {address} answered Describe badly: {problem}"
        problem = self._mismatch(desc)
        return f"simulator {address} does not match the pool: {problem}" if problem else ""

    def _mismatch(self, desc: ServerDescription) -> str:
        """How a server's spaces (fast/spaces.py's rule: all equal, bounds included) or catalog differ; "" if not."""
        if self.observation_space is None:
            return ""  # an empty pool takes the first server's
        return (
            space_mismatch("observation space", self.observation_space, desc.observation_space)
            or space_mismatch("action space", self.action_space, desc.action_space)
            or (
                f"catalog of {desc.num_clips} clips, the pool's has {self.num_clips}"
                if desc.num_clips != self.num_clips
                else ""
            )
        )

    def _mark_down(self, server: ServerHandle, why: str) -> bool:
        """The server failed a call: down, retried with backoff. False if it was down already."""
        StepTransport.drop(server)
        if not server.up:
            return False
        server.up = False
        server.faults += 1
        server.last_error = why
        server.backoff_s = self.timeouts.backoff_initial_s
        server.retry_at = time.monotonic() + server.backoff_s
        log.warning("simulator %s is down: %s", server.address, server.last_error)
        return True

    def _bad_answer(self, server: ServerHandle, problem: str) -> None:
        count_bad_answer(server, problem, self.max_bad_answers, lambda why: self._mark_down(server, why))

    async def readmit_due(self) -> list[ServerHandle]:
        """Try the down servers whose backoff elapsed; returns those re-admitted (their slots need a Reset)."""
        now = time.monotonic()
        # A server being tried already is not tried twice: VER's slots call this concurrently, and
        # two attempts would close each other's fresh channel.
        due = [s for s in self.servers if not s.up and not s.dropped and not s.readmitting and s.retry_at <= now]
        for server in due:
            server.readmitting = True
        try:
            back = await asyncio.gather(*(self._try_readmit(s) for s in due))
        finally:
            for server in due:
                server.readmitting = False
        return [s for s, ok in zip(due, back) if ok]

    async def _try_readmit(self, server: ServerHandle) -> bool:
        # A fresh channel (with its own subchannel pool, see open_channel): the old one may sit
        # in gRPC's own reconnect backoff and would fail fast even after the server came back.
        old, server.client = (
            server.client,
            SimulatorClient(server.address, timeout_s=self.timeouts.describe_s, credentials=self.credentials),
        )
        self._retire(old)
        try:
            desc = await asyncio.wait_for(server.client.describe(), self.timeouts.describe_s)
            problem = (
                answers.description_problem(desc)
                or self._mismatch(desc)
                or (
                    f"it now has {desc.num_slots} slots, had {server.num_slots}"
                    if desc.num_slots != server.num_slots
                    else ""
                )
            )
        except _FAULTS as exc:
            problem = _describe_error(exc)
        except TensorError as exc:
            problem = f"bad Describe answer: {exc}"
        if problem:
            server.last_error = problem
            server.backoff_s = min(server.backoff_s * 2, self.timeouts.backoff_max_s)
            server.retry_at = time.monotonic() + server.backoff_s
            return False
        _take_capabilities(server, desc, first=False)  # it may have restarted with other options
        server.up = True
        server.readmissions += 1
        log.warning("simulator %s re-admitted", server.address)
        return True

    async def step(self, slots: np.ndarray, env_actions: np.ndarray, *, unary: bool = False) -> PoolStep:
        """Step global `slots` with `env_actions` [k, ...]: one call per server, all concurrent.

        Lock-step callers use each server's StepStream (one call in flight per server); callers
        that step slots of one server concurrently (VER) must pass unary=True.
        """
        k = slots.size
        obs_space = self.observation_space
        out = PoolStep.zeros(k, obs_space)
        groups = self.by_server(slots)

        async def call(server: ServerHandle, positions: np.ndarray) -> None:
            local = self.slot_local[slots[positions]]
            started = time.perf_counter()
            reply = await self._call(
                server,
                lambda: self.transport.step(server, local, env_actions[positions], unary=unary),
                self.timeouts.step_s,
                lambda reply: answers.step_problem(reply, local, obs_space),
            )
            if reply is None:
                out.failed[positions] = True
                return
            server.step_latency_s = moving_average(server.step_latency_s, time.perf_counter() - started)
            out.take(positions, reply, reply.timing, server.slot_offset, self.counters)
            server.bad_answers = 0  # a good Step answer: it works again

        if len(groups) == 1:  # one server (the pipelined rounds' calls): no gather, no task of its own
            [(s, pos)] = groups.items()
            await call(self.servers[s], pos)
        else:
            await asyncio.gather(*(call(self.servers[s], pos) for s, pos in groups.items()))
        return out

    async def prepare(self, slots: np.ndarray, clips: np.ndarray, seeds: np.ndarray) -> None:
        """Ask the servers of global `slots` that serve Prepare to start loading these clips. A hint,
        never a fault: a server that is down or refuses is left to the Reset that follows (which loads
        as always); one that answers UNIMPLEMENTED is not asked again."""

        async def call(server: ServerHandle, positions: np.ndarray) -> None:
            local = self.slot_local[slots[positions]]
            try:
                await server.client.prepare(local, clips[positions], seeds[positions], timeout_s=self.timeouts.step_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    server.prefetch = False
                    log.warning("simulator %s: Prepare is unimplemented; resetting without it", server.address)
                return
            except (asyncio.TimeoutError, OSError):
                return
            self.counters.prepare_calls += 1

        groups = self.by_server(slots)
        serving = [s for s in groups if self.servers[s].up and self.servers[s].prefetch]
        await asyncio.gather(*(call(self.servers[s], groups[s]) for s in serving))

    def step_transport(self, server: ServerHandle, *, unary: bool = False) -> str:
        """How `step` reaches the server: "local socket", "grpc stream" or "grpc unary" (broker/transport.py)."""
        return self.transport.name(server, unary=unary)

    def steps_by_stream(self, server: ServerHandle, *, unary: bool = False) -> bool:
        """Whether `step` uses the server's StepStream (broker/transport.py)."""
        return self.transport.streams(server, unary=unary)

    @staticmethod
    def resets_batched(server: ServerHandle, *, batched: bool) -> bool:
        """Whether `reset` sends the server one call for several of its slots: the caller asks for
        batched resets and the server takes them."""
        return batched and server.batched_reset

    async def reset(self, slots: np.ndarray, clips: np.ndarray, seeds: np.ndarray, *, batched: bool) -> PoolReset:
        """Reset global `slots`: one call per server when `batched` (and the server takes several slots
        in one call), else one call per slot; servers concurrently, a server's per-slot calls too
        (at most UNBATCHED_RESET_CONCURRENCY at a time where it cannot batch what `batched` asked)."""
        k = slots.size
        obs_space = self.observation_space
        out = PoolReset.zeros(k, obs_space)

        async def call(server: ServerHandle, positions: np.ndarray, bound: asyncio.Semaphore | None) -> None:
            if bound is not None:
                async with bound:
                    return await call(server, positions, None)
            local = self.slot_local[slots[positions]]
            started = time.perf_counter()
            reply = await self._call(
                server,
                # The reset's own deadline: the client's default is Describe's, far shorter than a slow reset.
                lambda: server.client.reset(local, clips[positions], seeds[positions], timeout_s=self.timeouts.reset_s),
                self.timeouts.reset_s,
                lambda reply: answers.reset_problem(reply, local, obs_space),
            )
            if reply is None:
                out.failed[positions] = True
                return
            wall = time.perf_counter() - started
            server.reset_latency_s = moving_average(server.reset_latency_s, wall)
            out.call_walls.append((int(positions.size), wall))
            out.take(positions, reply.observations, reply.timing, self.counters)

        calls = []
        for s, positions in self.by_server(slots).items():
            server = self.servers[s]
            if self.resets_batched(server, batched=batched):
                calls.append(call(server, positions, None))
                continue
            # One call per slot: as the mode asked (unbounded, as it always was), or as the server
            # needs (bounded: see UNBATCHED_RESET_CONCURRENCY).
            bound = asyncio.Semaphore(UNBATCHED_RESET_CONCURRENCY) if batched and positions.size > 1 else None
            calls.extend(call(server, positions[j : j + 1], bound) for j in range(positions.size))
        out.calls = len(calls)
        await asyncio.gather(*calls)
        return out

    async def _call(
        self,
        server: ServerHandle,
        request: Callable[[], Awaitable[T]],
        timeout_s: float,
        problem: Callable[[T], str],
    ) -> T | None:
        """`request()` to a server that is up, within `timeout_s`, its answer checked by `problem`
        ("" when good); None when the server is down, fails now or answers badly (it is then
        marked down), and the caller's slots on it failed."""
        if not server.up:
            return None
        admission = server.readmissions
        try:
            # asyncio.timeout, not wait_for: no extra task per call on the step path.
            async with asyncio.timeout(timeout_s):
                reply = await request()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # the caller is being cancelled: not the server's doing
            # gRPC cancelled the call itself: its channel was closed under it. A failed call, not the
            # caller's cancellation, which would end a whole iteration.
            fault = partial(self._mark_down, server, "call cancelled: its channel was closed")
        except _FAULTS as exc:
            fault = partial(self._mark_down, server, _describe_error(exc))
        except TensorError as exc:  # an answer whose tensors do not even decode
            fault = partial(self._bad_answer, server, str(exc))
        else:
            why = problem(reply)
            fault = partial(self._bad_answer, server, why) if why else None
        if server.readmissions != admission:
            # Sent before the server went down and came back: whatever became of it says nothing of
            # this admission (neither used nor counted; the slot resets, as after any failed call).
            return None
        if fault is not None:
            fault()
            return None
        return reply

    def _retire(self, client: SimulatorClient) -> None:
        """Close a replaced channel once its calls end. Not at once: VER's other slots on the server
        may have calls in flight on it, and closing a channel cancels its calls locally, which their
        callers would take for their own task's cancellation. Each ends within its deadline."""
        grace_s = max(self.timeouts.step_s, self.timeouts.reset_s)
        task = asyncio.ensure_future(client.close(grace_s))
        self._retiring[client] = task
        task.add_done_callback(lambda _: self._retiring.pop(client, None))

    async def remove(self, address: str) -> ServerHandle:
        """Take the server at `address` out of the pool and close its channel; KeyError if it is not in it.

        Global slot ids are renumbered: the servers after it move down by its slot count, so
        `slot_server`, `slot_local`, every `index` and `slot_offset` stay consistent, and any
        sampler built over the old numbering must be rebuilt. Call it between iterations only:
        no call of the server may be in flight.
        """
        server = next((s for s in self.servers if s.address == address), None)
        if server is None:
            raise KeyError(address)
        self.servers.remove(server)
        self._renumber()
        StepTransport.drop(server)
        await server.client.close()
        return server

    def _renumber(self) -> None:
        """Indices, slot offsets and the slot maps from the servers list, in its order."""
        offset = 0
        for index, server in enumerate(self.servers):
            server.index, server.slot_offset = index, offset
            offset += server.num_slots
        self._number([s.num_slots for s in self.servers])

    async def close(self) -> None:
        for server in self.servers:
            StepTransport.drop(server)
            await server.client.close()
        for client, task in list(self._retiring.items()):  # no grace left: their calls end now
            task.cancel()
            await client.close()
        self._retiring.clear()


def _take_capabilities(server: ServerHandle, desc: ServerDescription, *, first: bool) -> None:
    """The server's Capabilities from its Describe; each fallback they imply is logged when it
    starts (when the server joins, or comes back with other options), not at every call."""
    if desc.streaming_step != server.streaming_step or (first and not desc.streaming_step):
        if desc.streaming_step:
            log.info("simulator %s: has StepStream again, using it", server.address)
        else:
            log.warning("simulator %s: no StepStream, using unary Step", server.address)
    if desc.batched_reset != server.batched_reset or (first and not desc.batched_reset):
        if desc.batched_reset:
            log.info("simulator %s: takes batched Resets again, using them", server.address)
        else:
            log.warning("simulator %s: no batched Reset, sending one Reset per slot", server.address)
    server.streaming_step, server.batched_reset = desc.streaming_step, desc.batched_reset
    server.cost_model = desc.cost_model
    server.prefetch = desc.prefetch
    server.local_step_socket = desc.local_step_socket


def moving_average(previous: float, sample: float, weight: float = LATENCY_EMA_WEIGHT) -> float:
    """Exponential moving average of latencies; `previous` 0 means no sample yet, so the first is taken whole."""
    return sample if previous == 0.0 else previous + weight * (sample - previous)


def _describe_error(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        # The details are the server's words: bounded, like any input a message quotes.
        return f"{exc.code().name}: {shorten(exc.details() or '', limit=300)}"
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}"

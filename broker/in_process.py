"""Simulators in this event loop, as a pool of slots without any transport (broker/slots.py).

`InProcessPool` drives real `Simulator`s (sim_server/simulator.py: slots, validation, the cost
model's emulated waits) directly: a Step or Reset of a server's slots is one await of its
`Simulator`, answered as the gRPC pool answers (`PoolStep`, `PoolReset`, the same episode
summaries, the same counters). There are no sockets, no deadlines to serialise against and no
membership changes, so sampling semantics can be tested and a whole training loop can run in
one process (examples/train_in_process.py); the batches are those of the gRPC pool over the
same simulators (tests/test_broker_samplers.py checks it for every lock-step mode).

Faults keep the gRPC pool's meaning where they have one: a call that raises (the env failed,
the Simulator refused the call) or times out marks that server down, its slots in the call
fail (zeros, `failed`) and need a Reset; an answer against the contract (broker/answers.py: a
NaN reward, an observation of the wrong shape or dtype) is a fault too, and `max_bad_answers`
in a row drop the server for the run. A server that is down is re-admitted by `readmit_due`
once its backoff elapsed (the Simulator is still there; nothing needs to answer Describe).

The pool takes the simulators built by its caller, so the broker imports nothing of the
simulator server's internals: anything with a Simulator's `env`, `reset`, `step` and
`prepare` will do.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from broker import answers
from broker.slots import PoolCounters, PoolReset, PoolStep, PoolTimeouts, SlotNumbering, count_bad_answer
from fast.spaces import space_mismatch
from sim_server.client import ResetReply, StepReply, episode_summary

log = logging.getLogger("fast.broker.in_process")


class LocalSimulator(Protocol):
    """What the pool uses of sim_server/simulator.py's `Simulator`."""

    env: Any  # num_slots, num_clips, observation_space, action_space

    async def reset(self, slot_ids: np.ndarray, clip_ids: np.ndarray, seeds: np.ndarray) -> tuple[np.ndarray, Any]: ...

    async def step(self, slot_ids: np.ndarray, actions: np.ndarray) -> Any: ...

    async def prepare(self, slot_ids: np.ndarray, clip_ids: np.ndarray, seeds: np.ndarray) -> None: ...


@dataclass
class InProcessServer:
    """One simulator of the pool, with the status a sampler reads (broker/slots.py `SlotServer`)."""

    index: int
    address: str  # a name for messages: "in-process:<index>"
    simulator: LocalSimulator
    num_slots: int
    slot_offset: int  # its local slot j is global slot slot_offset + j
    up: bool = True
    dropped: bool = False  # too many bad answers: never re-admitted in this run
    faults: int = 0
    readmissions: int = 0
    bad_answers: int = 0  # bad answers since its last good Step answer
    last_error: str = ""
    retry_at: float = 0.0
    prefetch: bool = True  # a Simulator serves Prepare


class InProcessPool(SlotNumbering):
    """`Simulator`s of this process as one pool of globally numbered slots (module docstring)."""

    def __init__(
        self,
        simulators: Sequence[LocalSimulator] = (),
        timeouts: PoolTimeouts | None = None,
        *,
        max_bad_answers: int = 5,
    ) -> None:
        super().__init__()
        self.timeouts = timeouts or PoolTimeouts()
        self.max_bad_answers = max_bad_answers
        self.servers: list[InProcessServer] = []
        self.observation_space = self.action_space = None
        self.num_clips = 0
        self.counters = PoolCounters()
        for simulator in simulators:
            self.add(simulator)

    def add(self, simulator: LocalSimulator) -> InProcessServer:
        """Give the simulator the next global slot ids; its spaces and catalog must match the pool's
        (ValueError, as the gRPC pool refuses a server that does not match)."""
        env = simulator.env
        index = len(self.servers)
        if self.observation_space is None:  # the first simulator sets the pool's spaces
            self.observation_space, self.action_space = env.observation_space, env.action_space
            self.num_clips = env.num_clips
        else:
            problem = (
                space_mismatch("observation space", self.observation_space, env.observation_space)
                or space_mismatch("action space", self.action_space, env.action_space)
                or (
                    f"catalog of {env.num_clips} clips, the pool's has {self.num_clips}"
                    if env.num_clips != self.num_clips
                    else ""
                )
            )
            if problem:
                raise ValueError(f"simulator in-process:{index} does not match the pool: {problem}")
        server = InProcessServer(index, f"in-process:{index}", simulator, env.num_slots, self.num_slots)
        self.servers.append(server)
        self._number([s.num_slots for s in self.servers])
        return server

    async def close(self) -> None:
        """Nothing to close (the gRPC pool's counterpart closes its channels)."""

    # -- faults -------------------------------------------------------------------------------

    def _mark_down(self, server: InProcessServer, why: str) -> None:
        if not server.up:
            return
        server.up = False
        server.faults += 1
        server.last_error = why
        server.retry_at = time.monotonic() + self.timeouts.backoff_initial_s
        log.warning("simulator %s is down: %s", server.address, why)

    def _bad_answer(self, server: InProcessServer, problem: str) -> None:
        count_bad_answer(server, problem, self.max_bad_answers, lambda why: self._mark_down(server, why))

    async def readmit_due(self) -> list[InProcessServer]:
        """Bring back the down servers whose backoff elapsed (not the dropped); their slots need a Reset."""
        now = time.monotonic()
        back = [s for s in self.servers if not s.up and not s.dropped and s.retry_at <= now]
        for server in back:
            server.up = True
            server.readmissions += 1
            log.warning("simulator %s re-admitted", server.address)
        return back

    async def _call(self, server: InProcessServer, call, timeout_s: float, problem):
        """`await call()` within `timeout_s`, its answer checked by `problem`; None when the server
        is down, raises, times out or answers badly (it is then marked down)."""
        if not server.up:
            return None
        try:
            async with asyncio.timeout(timeout_s):
                answer = await call()
        except asyncio.TimeoutError:
            self._mark_down(server, "timed out")
            return None
        except Exception as exc:  # the env raised, or the Simulator refused the call
            self._mark_down(server, f"{type(exc).__name__}: {exc}")
            return None
        why = problem(answer)
        if why:
            self._bad_answer(server, why)
            return None
        return answer

    # -- calls --------------------------------------------------------------------------------

    async def step(self, slots: np.ndarray, env_actions: np.ndarray, *, unary: bool = False) -> PoolStep:
        """Step global `slots`: one Simulator call per server, all concurrent (`unary` changes nothing here)."""
        k = slots.size
        space = self.observation_space
        out = PoolStep.zeros(k, space)

        async def answer(server: InProcessServer, local: np.ndarray, actions: np.ndarray) -> tuple[StepReply, Any]:
            outcome = await server.simulator.step(local, actions)
            r = outcome.result
            reply = StepReply(
                slot_ids=local,
                observations=np.asarray(r.observations),
                rewards=np.asarray(r.rewards).astype(np.float32, copy=False),
                terminated=np.asarray(r.terminated).astype(bool, copy=False),
                truncated=np.asarray(r.truncated).astype(bool, copy=False),
                episodes=[episode_summary(e) for e in outcome.episodes],
            )
            return reply, outcome.timing

        async def call(server: InProcessServer, positions: np.ndarray) -> None:
            local = self.slot_local[slots[positions]]
            got = await self._call(
                server,
                lambda: answer(server, local, env_actions[positions]),
                self.timeouts.step_s,
                lambda got: answers.step_problem(got[0], local, space),
            )
            if got is None:
                out.failed[positions] = True
                return
            reply, timing = got
            out.take(positions, reply, timing, server.slot_offset, self.counters)
            server.bad_answers = 0  # a good Step answer: it works again

        groups = self.by_server(slots)
        if len(groups) == 1:
            [(s, positions)] = groups.items()
            await call(self.servers[s], positions)
        else:
            await asyncio.gather(*(call(self.servers[s], positions) for s, positions in groups.items()))
        return out

    async def reset(self, slots: np.ndarray, clips: np.ndarray, seeds: np.ndarray, *, batched: bool) -> PoolReset:
        """Reset global `slots`: one call per server when `batched`, else one per slot; all concurrent."""
        k = slots.size
        space = self.observation_space
        out = PoolReset.zeros(k, space)

        async def answer(server: InProcessServer, local: np.ndarray, positions: np.ndarray) -> tuple[ResetReply, Any]:
            observations, timing = await server.simulator.reset(local, clips[positions], seeds[positions])
            return ResetReply(slot_ids=local, observations=np.asarray(observations), timing=None), timing

        async def call(server: InProcessServer, positions: np.ndarray) -> None:
            local = self.slot_local[slots[positions]]
            got = await self._call(
                server,
                lambda: answer(server, local, positions),
                self.timeouts.reset_s,
                lambda got: answers.reset_problem(got[0], local, space),
            )
            if got is None:
                out.failed[positions] = True
                return
            reply, timing = got
            out.take(positions, reply.observations, timing, self.counters)

        calls = []
        for s, positions in self.by_server(slots).items():
            if batched:
                calls.append(call(self.servers[s], positions))
            else:
                calls.extend(call(self.servers[s], positions[j : j + 1]) for j in range(positions.size))
        out.calls = len(calls)
        await asyncio.gather(*calls)
        return out

    async def prepare(self, slots: np.ndarray, clips: np.ndarray, seeds: np.ndarray) -> None:
        """Have the servers of global `slots` start loading these clips; a hint, never a fault."""

        async def call(server: InProcessServer, positions: np.ndarray) -> None:
            local = self.slot_local[slots[positions]]
            try:
                await server.simulator.prepare(local, clips[positions], seeds[positions])
            except Exception:  # refused (a slot being reset): the Reset that follows loads as always
                return
            self.counters.prepare_calls += 1

        groups = self.by_server(slots)
        await asyncio.gather(*(call(self.servers[s], p) for s, p in groups.items() if self.servers[s].up))

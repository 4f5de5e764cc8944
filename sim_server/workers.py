"""Serve a SlotEnv from worker processes: `fast sim-server --processes N` (docs/simulator_kit.md).

Many simulators allow one engine per process, or run only in the main thread of their process.
`ProcessSlotEnv` spreads the slots over N worker processes in contiguous blocks (worker w holds
slots block w, as Stable-Baselines3's SubprocVecEnv holds one env per process); each worker
builds the same `--env` spec for its share of the slots and runs every env call in its MAIN
thread, answering commands that arrive over its pipe. A call of k slots sends one message to
each worker holding some of them, all before waiting for any answer, so the workers step in
parallel; the answers are put back in the call's order.

Failure is bounded and named. Every wait on a pipe is bounded (`reply_timeout_s`); a worker
that exits, or does not answer in time (it is then killed), makes every later call that names
one of its slots fail UNAVAILABLE with a message naming the worker, its pid and its slots,
while calls on the other workers' slots and Describe keep working. An env that raises fails
the call INTERNAL with the worker's name and the exception; the slots of such a call may have
moved on in their engines, so the caller should reset them.

Lifetime: workers are daemon processes started from a fork server (forking a process that holds
gRPC state is unsafe), ignore SIGINT (a terminal's Ctrl-C reaches the whole process group; the
server drains and then stops them), exit when their pipe closes (the server is gone, even by
SIGKILL), and are joined by `close()`, which the server calls after its SIGTERM drain.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from fast.spaces import SpaceSpec, space_mismatch
from sim_server.env_api import StepResult
from sim_server.errors import ErrorKind, SimError

REPLY_TIMEOUT_S = 120.0  # the longest one reset or step of a worker may take
START_TIMEOUT_S = 300.0  # the longest a worker may take to build its envs
JOIN_TIMEOUT_S = 5.0  # how long close() waits for a worker to exit before killing it


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "it stopped answering"
    if code < 0:
        try:
            return f"it was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"it was killed by signal {-code}"
    return f"it exited with code {code}"


def _worker_main(
    conn: Connection,
    spec: str,
    num_slots: int,
    seed: int,
    num_clips: int | None,
    env_kwargs: dict[str, Any],
) -> None:
    """A worker's whole life, in its main thread: build the env, then answer commands until told to close."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from sim_server.environments import make_env

    try:
        env = make_env(spec, num_slots, seed=seed, num_clips=num_clips, env_kwargs=env_kwargs)
        ready = {
            "observation_space": env.observation_space,
            "action_space": env.action_space,
            "num_clips": int(env.num_clips),
            "map_ids": np.array([env.map_id(c) for c in range(int(env.num_clips))], dtype=np.int64),
        }
    except BaseException as exc:  # noqa: BLE001 - the server reports it and stops
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", ready))
    try:
        while True:
            try:
                command, args = conn.recv()
            except (EOFError, OSError):  # the server is gone
                break
            if command == "close":
                break
            try:
                answer = env.reset(*args) if command == "reset" else env.step(*args)
                conn.send(("ok", answer))
            except Exception as exc:  # noqa: BLE001 - the call fails INTERNAL; the worker lives on
                last = traceback.extract_tb(exc.__traceback__)[-1:]
                where = f" at {last[0].filename}:{last[0].lineno}" if last else ""
                conn.send(("error", f"env.{command} raised {type(exc).__name__}: {exc}{where}"))
    finally:
        close = getattr(env, "close", None)
        if close is not None:
            close()


@dataclass
class _Worker:
    index: int
    process: multiprocessing.Process
    conn: Connection
    slots: np.ndarray  # the global slot ids it holds, in local order
    gone: str | None = None  # why it can no longer serve, once it cannot

    def name(self) -> str:
        first, last = int(self.slots[0]), int(self.slots[-1])
        held = f"slot {first}" if first == last else f"slots {first}-{last}"
        return f"worker {self.index} (pid {self.process.pid}, {held})"


class ProcessSlotEnv:
    """A SlotEnv whose slots live in `processes` worker processes, each building `spec` for its share."""

    def __init__(
        self,
        spec: str,
        num_slots: int,
        *,
        processes: int,
        seed: int = 0,
        num_clips: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
        reply_timeout_s: float = REPLY_TIMEOUT_S,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        if not 1 <= processes <= num_slots:
            raise ValueError(f"--processes must be between 1 and the number of slots ({num_slots}); got {processes}")
        self.num_slots = num_slots
        self.reply_timeout_s = reply_timeout_s
        self._worker_of = np.empty(num_slots, dtype=np.int64)
        self._local = np.empty(num_slots, dtype=np.int64)
        context = multiprocessing.get_context("forkserver")
        self._workers: list[_Worker] = []
        for index, slots in enumerate(np.array_split(np.arange(num_slots, dtype=np.int64), processes)):
            self._worker_of[slots] = index
            self._local[slots] = np.arange(slots.size)
            ours, theirs = context.Pipe()
            process = context.Process(
                target=_worker_main,
                args=(theirs, spec, int(slots.size), seed, num_clips, dict(env_kwargs or {})),
                name=f"fast-sim-worker-{index}",
                daemon=True,
            )
            process.start()
            theirs.close()
            self._workers.append(_Worker(index, process, ours, slots))
        try:
            readies = [self._receive(w, time.monotonic() + start_timeout_s, "start") for w in self._workers]
        except SimError as exc:
            self.close()
            raise ValueError(f"{spec}: {exc.message}") from None
        first = readies[0]
        for worker, ready in zip(self._workers[1:], readies[1:]):
            for what in ("observation_space", "action_space"):
                mismatch = space_mismatch(what.replace("_", " "), first[what], ready[what])
                if mismatch:
                    self.close()
                    raise ValueError(f"{spec}: {worker.name()} disagrees with worker 0: {mismatch}")
        self.observation_space: SpaceSpec = first["observation_space"]
        self.action_space: SpaceSpec = first["action_space"]
        self.num_clips = int(first["num_clips"])
        self._map_ids = first["map_ids"]

    @property
    def pids(self) -> list[int]:
        return [int(w.process.pid or 0) for w in self._workers]

    def describe_workers(self) -> str:
        return "fast sim-server workers: " + ", ".join(w.name() for w in self._workers)

    def map_id(self, clip_id: int) -> int:
        return int(self._map_ids[clip_id])

    # --- one exchange with the workers a call touches -------------------------------------------------

    def _mark_gone(self, worker: _Worker, why: str) -> None:
        if worker.gone is None:
            worker.gone = why
            if worker.process.is_alive():
                worker.process.kill()
            worker.process.join(timeout=JOIN_TIMEOUT_S)
            worker.conn.close()

    def _unavailable(self, worker: _Worker) -> SimError:
        return SimError(
            ErrorKind.UNAVAILABLE,
            f"{worker.name()} is gone ({worker.gone}); its slots cannot be served until the server restarts",
        )

    def _receive(self, worker: _Worker, deadline: float, what: str) -> Any:
        """The worker's next answer, waiting until `deadline` at most; SimError if it failed or is gone."""
        try:
            ready = worker.conn.poll(max(0.0, deadline - time.monotonic()))
            if not ready:
                self._mark_gone(worker, f"it did not answer a {what} within {self.reply_timeout_s:g} s and was killed")
                raise self._unavailable(worker)
            status, answer = worker.conn.recv()
        except (EOFError, OSError):
            worker.process.join(timeout=JOIN_TIMEOUT_S)
            self._mark_gone(worker, _describe_exit(worker.process.exitcode))
            raise self._unavailable(worker) from None
        if status == "error":
            raise SimError(ErrorKind.INTERNAL, f"{worker.name()}: {answer}")
        return answer

    def _exchange(self, command: str, slot_ids: np.ndarray, *columns: np.ndarray) -> list[tuple[np.ndarray, Any]]:
        """Send each involved worker its part of the call, then collect every answer: [(positions, answer)]."""
        owners = self._worker_of[slot_ids]
        parts = [(self._workers[w], np.flatnonzero(owners == w)) for w in np.unique(owners)]
        for worker, _ in parts:
            if worker.gone is not None:
                raise self._unavailable(worker)
        sent: list[tuple[_Worker, np.ndarray]] = []
        failure: SimError | None = None
        for worker, positions in parts:
            try:
                worker.conn.send((command, (self._local[slot_ids[positions]], *(c[positions] for c in columns))))
                sent.append((worker, positions))
            except (OSError, ValueError):
                worker.process.join(timeout=JOIN_TIMEOUT_S)
                self._mark_gone(worker, _describe_exit(worker.process.exitcode))
                failure = failure or self._unavailable(worker)
        deadline = time.monotonic() + self.reply_timeout_s
        answers = []
        for worker, positions in sent:  # drain every answer, so no pipe keeps a stale one
            try:
                answers.append((positions, self._receive(worker, deadline, command)))
            except SimError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
        return answers

    # --- the SlotEnv calls ------------------------------------------------------------------------

    def reset(self, slot_ids: np.ndarray, clip_ids: np.ndarray, seeds: np.ndarray) -> np.ndarray:
        slot_ids = np.asarray(slot_ids, dtype=np.int64)
        answers = self._exchange("reset", slot_ids, np.asarray(clip_ids), np.asarray(seeds))
        observations = np.empty((slot_ids.size, *self.observation_space.shape), dtype=self.observation_space.dtype)
        for positions, obs in answers:
            observations[positions] = obs
        return observations

    def step(self, slot_ids: np.ndarray, actions: np.ndarray) -> StepResult:
        slot_ids = np.asarray(slot_ids, dtype=np.int64)
        answers = self._exchange("step", slot_ids, np.asarray(actions))
        k = slot_ids.size
        observations = np.empty((k, *self.observation_space.shape), dtype=self.observation_space.dtype)
        rewards = np.empty(k, dtype=np.float32)
        terminated = np.empty(k, dtype=bool)
        truncated = np.empty(k, dtype=bool)
        metrics: list[dict[str, float] | None] = [None] * k
        for positions, result in answers:
            observations[positions] = result.observations
            rewards[positions] = result.rewards
            terminated[positions] = result.terminated
            truncated[positions] = result.truncated
            for j, m in zip(positions, result.episode_metrics or [None] * positions.size):
                metrics[j] = m
        return StepResult(observations, rewards, terminated, truncated, metrics)

    def close(self) -> None:
        """Ask every worker to exit, join it (bounded), kill one that will not."""
        for worker in self._workers:
            if worker.gone is None:
                try:
                    worker.conn.send(("close", ()))
                except (OSError, ValueError):
                    pass
        for worker in self._workers:
            worker.process.join(timeout=JOIN_TIMEOUT_S)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout=JOIN_TIMEOUT_S)
            if worker.gone is None:
                worker.gone = "the server closed it"
                worker.conn.close()

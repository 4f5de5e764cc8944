"""A broker's training run: connect, then sample -> submit -> update, iteration after iteration.

Strictly on-policy: an iteration samples with policy version v and submits with v; the
learner refuses anything else. When the learner is unreachable the run waits (bounded by
learner_wait_s) and retries the same batch; when the learner answers that the batch is stale
(it restarted from an older checkpoint, or another broker advanced it), the batch is
dropped, the current policy fetched, and sampling starts again.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import math
import time
from pathlib import Path

import grpc
import numpy as np

from broker.config import BrokerConfig
from broker.dealer import ClipDealer
from broker.policy_runner import PolicyRunner
from broker.pool import PoolTimeouts, SimulatorPool, resolve_addresses
from broker.retry import RetryExpired, retry
from broker.samplers import Sampler, SamplingError, make_sampler
from fast.rpc import Credentials
from learner.client import LearnerClient

log = logging.getLogger("fast.broker")


class RunFailed(RuntimeError):
    pass


class RunState(enum.Enum):
    """Where a run is; only BrokerRun moves it (its value is the word the broker prints)."""

    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    DONE = "done"
    FAILED = "failed"

    @property
    def finished(self) -> bool:
        return self in (RunState.DONE, RunState.FAILED)


class BrokerRun:
    def __init__(self, config: BrokerConfig, credentials: Credentials | None = None) -> None:
        """`credentials`: what its calls to the simulators and the learner carry (None: the environment's token)."""
        self.config = config
        self._state = RunState.STARTING
        self._error = ""  # why the run failed
        self.iteration = 0
        self.valid_total = 0
        self.stale_batches = 0
        self.last_metrics: dict | None = None
        self.pool = SimulatorPool(
            PoolTimeouts(
                step_s=config.step_timeout_s, reset_s=config.reset_timeout_s, describe_s=config.describe_timeout_s
            ),
            credentials=credentials,
            max_bad_answers=config.max_bad_answers,
        )
        self.runner: PolicyRunner | None = None
        self.learner = LearnerClient(
            config.learner, update_timeout_s=config.update_timeout_s, credentials=self.pool.credentials
        )
        self._pending_addresses: list[str] = []
        self._pause = asyncio.Event()
        self._pause.set()  # set = running
        self._stop = False
        self._sampler: Sampler | None = None
        self._dealer: ClipDealer | None = None
        self._metrics_file = Path(config.run_dir) / "metrics.jsonl" if config.run_dir else None

    # -- control -------------------------------------------------------------------------
    def pause(self) -> None:
        self._pause.clear()
        if self._state is RunState.RUNNING:
            self._state = RunState.PAUSED

    def resume(self) -> None:
        self._pause.set()
        if self._state is RunState.PAUSED:
            self._state = RunState.RUNNING

    def stop(self) -> None:
        self._stop = True
        self._pause.set()

    def fail(self, reason: str) -> None:
        """The run is over, unfinished: it hit an error, or its task was cancelled mid-iteration."""
        self._state, self._error = RunState.FAILED, reason

    def register(self, address: str) -> None:
        """Queue a simulator server; it joins at the next iteration boundary."""
        self._pending_addresses.append(address)

    @property
    def state(self) -> RunState:
        return self._state

    @property
    def error(self) -> str:
        return self._error

    @property
    def policy_version(self) -> int:
        return self.runner.version if self.runner else -1

    # -- the run -------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            await self._connect()
            self._state = RunState.RUNNING
            total = self.config.iterations
            while not self._stop and (total == 0 or self.iteration < total):
                await self._pause.wait()
                if self._stop:
                    break
                await self._admit_new_servers()
                await self._iterate()
            self._state = RunState.DONE
        except (RunFailed, SamplingError, ConnectionError, ValueError) as exc:
            self.fail(str(exc))
            log.error("run failed: %s", exc)
        finally:
            await self.pool.close()
            await self.learner.close()

    async def _connect(self) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        addresses = [a for spec in self.config.simulators for a in resolve_addresses(spec)]
        for address in addresses:
            await self._retry_until(deadline, lambda a=address: self.pool.add(a), f"simulator {address}")
        obs_space, act_space = self.pool.observation_space, self.pool.action_space
        await self._retry_until(
            deadline, lambda: self.learner.initialize(obs_space, act_space), f"learner {self.config.learner}"
        )
        policy = await self.learner.get_policy()
        self.runner = PolicyRunner(obs_space, act_space, policy.hidden_sizes, seed=self.config.seed)
        self.runner.load(policy.version, policy.weights)
        self._dealer = ClipDealer(self.pool.num_clips, holdout_every=self.config.holdout_every, seed=self.config.seed)
        self._sampler = self._make_sampler()

    async def _retry_until(self, deadline: float, attempt, what: str):
        """Start-up: a simulator or the learner may not be up yet; connection errors are retried too."""
        try:
            return await retry(
                attempt,
                deadline=deadline,
                delay_s=0.1,
                max_delay_s=2.0,
                errors=(grpc.aio.AioRpcError, ConnectionError, OSError),
            )
        except RetryExpired as expired:
            waited = self.config.startup_timeout_s
            raise RunFailed(f"{what} did not answer within {waited:g} s: {expired.error}") from None
        except grpc.aio.AioRpcError as exc:
            raise RunFailed(f"{what}: {exc.code().name}: {exc.details()}") from None

    def _make_sampler(self) -> Sampler:
        c = self.config
        return make_sampler(
            c.mode,
            self.pool,
            self.runner,
            self._dealer,
            samples_per_iteration=c.samples_per_iteration,
            alpha=c.alpha,
            t_max=c.t_max,
            stall_timeout_s=c.stall_timeout_s,
        )

    async def _admit_new_servers(self) -> None:
        """Servers registered at run time, or new IPs behind a DNS name, join between iterations."""
        known = {s.address for s in self.pool.servers}
        candidates, self._pending_addresses = list(self._pending_addresses), []
        for spec in self.config.simulators:
            if spec.startswith("dns:"):
                try:
                    candidates += resolve_addresses(spec)
                except OSError as exc:
                    log.warning("cannot resolve %s: %s", spec, exc)
        joined = False
        for address in dict.fromkeys(candidates):
            if address in known:
                continue
            try:
                await self.pool.add(address)
                joined = True
                log.info("simulator %s joined", address)
            except (ConnectionError, ValueError) as exc:
                log.warning("simulator %s not admitted: %s", address, exc)
        if joined:
            self._sampler = self._make_sampler()

    async def _iterate(self) -> None:
        started = time.perf_counter()
        version = self.runner.version
        batch, stats = await self._sampler.sample()
        sampling = stats.summary()
        reply = await self._submit(batch, version)
        if reply is None:  # stale: the learner moved on; sample again with its policy
            return
        self.runner.load(reply.policy.version, reply.policy.weights)
        self.iteration += 1
        self.valid_total += stats.valid
        metrics = {
            "iteration": self.iteration,
            "policy_version": version,
            "time": time.time(),
            "iteration_time_s": time.perf_counter() - started,
            **sampling,
            "learner": {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in reply.stats.items()},
        }
        self.last_metrics = metrics
        if self._metrics_file is not None:
            self._metrics_file.parent.mkdir(parents=True, exist_ok=True)
            with self._metrics_file.open("a") as f:
                f.write(json.dumps(metrics, default=_json_default) + "\n")

    async def _submit(self, batch: dict[str, np.ndarray], version: int):
        deadline = time.monotonic() + self.config.learner_wait_s

        def before_wait(exc: grpc.aio.AioRpcError, delay_s: float) -> None:
            if self._stop:
                raise RunFailed("stopped while waiting for the learner; the last batch was not learnt from") from None
            log.warning("learner unavailable (%s); retrying in %.1f s", exc.code().name, delay_s)

        try:
            return await retry(
                lambda: self.learner.submit(batch, version, return_policy=True),
                deadline=deadline,
                delay_s=0.2,
                max_delay_s=5.0,
                before_wait=before_wait,
            )
        except RetryExpired:
            raise RunFailed(f"learner {self.config.learner} unavailable for {self.config.learner_wait_s:g} s") from None
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise RunFailed(f"learner refused the batch: {exc.code().name}: {exc.details()}") from None
            refusal = exc.details()
        # Stale version, or a learner restarted without our spaces: re-initialise
        # (idempotent), fetch its policy, and drop the batch if the version moved.
        spaces = self.pool.observation_space, self.pool.action_space
        await self._retry_learner(deadline, lambda: self.learner.initialize(*spaces))
        policy = await self._retry_learner(deadline, self.learner.get_policy)
        if policy.version == version:
            raise RunFailed(f"learner refused the batch: {refusal}")
        log.warning(
            "batch of version %d refused (%s); sampling again with version %d", version, refusal, policy.version
        )
        self.runner.load(policy.version, policy.weights)
        self.stale_batches += 1
        return None

    async def _retry_learner(self, deadline: float, call):
        try:
            return await retry(call, deadline=deadline, delay_s=0.2, max_delay_s=5.0)
        except RetryExpired as expired:
            error = expired.error
        except grpc.aio.AioRpcError as exc:
            error = exc
        raise RunFailed(f"learner: {error.code().name}: {error.details()}")


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")

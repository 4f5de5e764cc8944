"""A broker's training run: connect, then sample -> submit -> update, iteration after iteration.

Strictly on-policy: an iteration samples with policy version v and submits with v; the
learner refuses anything else. When the learner is unreachable the run waits (bounded by
learner_wait_s) and retries the same batch; when the learner answers that the batch is stale
(it restarted from an older checkpoint, or another broker advanced it), the batch is
dropped, the current policy fetched, and sampling starts again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from pathlib import Path

import grpc
import numpy as np

from broker.config import BrokerConfig
from broker.dealer import ClipDealer
from broker.lockstep import LockstepSampler, SamplingError
from broker.policy_runner import PolicyRunner
from broker.pool import PoolTimeouts, SimulatorPool, resolve_addresses
from broker.ver import VerSampler
from learner.client import LearnerClient

log = logging.getLogger("fast.broker")

_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


class RunFailed(RuntimeError):
    pass


class BrokerRun:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.state = "starting"  # starting | running | paused | done | failed
        self.error = ""
        self.iteration = 0
        self.valid_total = 0
        self.stale_batches = 0
        self.last_metrics: dict | None = None
        self.pool = SimulatorPool(
            PoolTimeouts(step_s=config.step_timeout_s, reset_s=config.reset_timeout_s, describe_s=config.describe_timeout_s)
        )
        self.runner: PolicyRunner | None = None
        self.learner = LearnerClient(config.learner, update_timeout_s=config.update_timeout_s)
        self._pending_addresses: list[str] = []
        self._pause = asyncio.Event()
        self._pause.set()  # set = running
        self._stop = False
        self._sampler = None
        self._dealer: ClipDealer | None = None
        self._metrics_file = Path(config.run_dir) / "metrics.jsonl" if config.run_dir else None

    # -- control -------------------------------------------------------------------------
    def pause(self) -> None:
        self._pause.clear()
        if self.state == "running":
            self.state = "paused"

    def resume(self) -> None:
        self._pause.set()
        if self.state == "paused":
            self.state = "running"

    def stop(self) -> None:
        self._stop = True
        self._pause.set()

    def register(self, address: str) -> None:
        """Queue a simulator server; it joins at the next iteration boundary."""
        self._pending_addresses.append(address)

    @property
    def policy_version(self) -> int:
        return self.runner.version if self.runner else -1

    # -- the run -------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            await self._connect()
            self.state = "running"
            total = self.config.iterations
            while not self._stop and (total == 0 or self.iteration < total):
                await self._pause.wait()
                if self._stop:
                    break
                await self._admit_new_servers()
                await self._iterate()
            self.state = "done"
        except (RunFailed, SamplingError, ConnectionError, ValueError) as exc:
            self.state, self.error = "failed", str(exc)
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
        await self._retry_until(deadline, lambda: self.learner.initialize(obs_space, act_space), f"learner {self.config.learner}")
        policy = await self.learner.get_policy()
        self.runner = PolicyRunner(obs_space, act_space, policy.hidden_sizes, seed=self.config.seed)
        self.runner.load(policy.version, policy.weights)
        self._dealer = ClipDealer(self.pool.num_clips, holdout_every=self.config.holdout_every, seed=self.config.seed)
        self._sampler = self._make_sampler()

    async def _retry_until(self, deadline: float, attempt, what: str):
        delay = 0.1
        while True:
            try:
                return await attempt()
            except (grpc.aio.AioRpcError, ConnectionError, OSError) as exc:
                if isinstance(exc, grpc.aio.AioRpcError) and exc.code() not in _RETRYABLE:
                    raise RunFailed(f"{what}: {exc.code().name}: {exc.details()}") from None
                if time.monotonic() + delay > deadline:
                    raise RunFailed(f"{what} did not answer within {self.config.startup_timeout_s:g} s: {exc}") from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _make_sampler(self):
        c = self.config
        if c.mode == "ver":
            return VerSampler(self.pool, self.runner, self._dealer, samples_per_iteration=c.samples_per_iteration,
                              stall_timeout_s=c.stall_timeout_s)
        return LockstepSampler(self.pool, self.runner, self._dealer, mode=c.mode, samples_per_iteration=c.samples_per_iteration,
                               alpha=c.alpha, t_max=c.t_max, stall_timeout_s=c.stall_timeout_s)

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
        delay = 0.2
        while True:
            try:
                return await self.learner.submit(batch, version, return_policy=True)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    # Stale version, or a learner restarted without our spaces: re-initialise
                    # (idempotent), fetch its policy, and drop the batch if the version moved.
                    await self._retry_learner(deadline, lambda: self.learner.initialize(self.pool.observation_space, self.pool.action_space))
                    policy = await self._retry_learner(deadline, self.learner.get_policy)
                    if policy.version == version:
                        raise RunFailed(f"learner refused the batch: {exc.details()}") from None
                    log.warning("batch of version %d refused (%s); sampling again with version %d", version, exc.details(), policy.version)
                    self.runner.load(policy.version, policy.weights)
                    self.stale_batches += 1
                    return None
                if exc.code() not in _RETRYABLE:
                    raise RunFailed(f"learner refused the batch: {exc.code().name}: {exc.details()}") from None
                if time.monotonic() + delay > deadline:
                    raise RunFailed(f"learner {self.config.learner} unavailable for {self.config.learner_wait_s:g} s") from None
                if self._stop:
                    raise RunFailed("stopped while waiting for the learner; the last batch was not learnt from") from None
                log.warning("learner unavailable (%s); retrying in %.1f s", exc.code().name, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _retry_learner(self, deadline: float, call):
        delay = 0.2
        while True:
            try:
                return await call()
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _RETRYABLE or time.monotonic() + delay > deadline:
                    raise RunFailed(f"learner: {exc.code().name}: {exc.details()}") from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")

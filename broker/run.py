"""A broker's training run: connect, then sample -> submit -> update, iteration after iteration.

Strictly on-policy: an iteration samples with policy version v and submits with v; the
learner refuses anything else. When the learner is unreachable the run waits (bounded by
learner_wait_s) and retries the same batch; when the learner answers that the batch is stale
(it restarted from an older checkpoint, or another broker advanced it), the batch is
dropped, the current policy fetched, and sampling starts again. A learner that went back to an
older version, or a run directory that holds a metrics.jsonl at start (a restart by the platform),
makes the run resume there (`_resume`): the lines past the learner's version are dropped and the
iterations numbered on, so that each version is recorded once.

Control calls (pause, stop, UpdateSettings, DetachSimulator, RegisterSimulator) take effect
between iterations, at the boundary before the next one samples: a batch is never cut short,
and no collected transition is lost.

The sampling mode may change at a boundary too (UpdateSettings, or `--mode auto`'s choice,
broker/advisor/auto_mode.py): every mode's batch is a complete on-policy batch, so the next
iteration simply samples with a fresh sampler of the new mode over the same pool, runner and
dealer. Its slots start fresh (the live episodes were cut at the last batch's end, as
truncations); the old sampler holds nothing that outlives it (a slot's clip prepared ahead is
dropped by its server at the slot's next Reset; the servers' step streams stay on the pool's
handles, idle while a unary mode samples).
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import math
import time
from dataclasses import asdict, replace
from pathlib import Path

import grpc
import numpy as np

from broker.advisor.auto_alpha import PRIOR_ALPHA, AlphaChoice, AutoAlpha
from broker.advisor.auto_mode import AutoMode, ModeChoice
from broker.config import BrokerConfig
from broker.dealer import ClipDealer, pool_locality
from broker.group_control import GroupControl, Requests
from broker.histogram import EPISODE_LENGTH_BOUNDS, EPISODE_RETURN_BOUNDS, CumulativeHistogram
from broker.history import MetricsHistory
from broker.metrics import IterationStats
from broker.metrics_file import METRICS_FILE, cut_file
from broker.policy_runner import PolicyRunner
from broker.pool import PoolTimeouts, ServerHandle, SimulatorPool
from broker.retry import RetryExpired, retry
from broker.samplers import Sampler, SamplingError, make_sampler
from broker.settings import RunSettings, changes, learner_changes
from fast.addresses import resolve_addresses, resolve_shard
from fast.quoting import quote
from fast.rpc import Credentials
from learner.client import LearnerClient

log = logging.getLogger("fast.broker")


class RunFailed(RuntimeError):
    pass


class ControlRefused(RuntimeError):
    """A control call the run's state forbids (FAILED_PRECONDITION); the message says why."""


class UnknownSimulator(LookupError):
    """A control call names a simulator that is not attached (NOT_FOUND); the message quotes it."""

    def __str__(self) -> str:  # LookupError's str would repr the message
        return str(self.args[0]) if self.args else ""


class RunState(enum.Enum):
    """Where a run is; only BrokerRun moves it (its value is the word the broker prints)."""

    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    PAUSING = "pausing"  # asked to pause; the iteration in flight finishes first
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
        self.iteration = config.first_iteration  # iterations learnt from, this broker's and its predecessors'
        self.valid_total = 0
        self.stale_batches = 0
        self.last_metrics: dict | None = None
        # Since the run started, over the iterations learnt from (the metrics.jsonl lines).
        self.transitions_total = 0
        self.global_resets_total = 0
        self.faults_total = 0
        self.episode_lengths = CumulativeHistogram(EPISODE_LENGTH_BOUNDS)
        self.episode_returns = CumulativeHistogram(EPISODE_RETURN_BOUNDS)
        self.history = MetricsHistory()
        # The settings in force, those accepted for the next boundary, and the changes the next
        # metrics line reports (those applied at a boundary whose iteration was refused as stale
        # wait for the iteration that is learnt from).
        # alpha auto (fast only): the window of the run's costs and episode lengths, made once the pool
        # is known, and the choice in force (broker/advisor/auto_alpha.py).
        auto = config.alpha == "auto"
        alpha = min(max(PRIOR_ALPHA, config.alpha_min), config.alpha_max) if auto else config.alpha
        # mode auto: the first candidate first (broker/advisor/auto_mode.py). The chooser is kept, and fed
        # every iteration, with auto off too: turned on live, it starts from the figures so far.
        mode_auto = config.mode == "auto"
        self._modes = AutoMode(
            tuple(config.mode_candidates), probe_every=config.mode_probe_every, margin=config.mode_margin
        )
        mode = config.mode_candidates[0] if mode_auto else config.mode
        self.settings = RunSettings(
            alpha, config.t_max, config.samples_per_iteration, alpha_auto=auto, mode=mode, mode_auto=mode_auto
        )
        self._mode_choice: ModeChoice | None = None  # the decision the iteration in flight samples with
        self._mode_choosing = False  # auto was on at the last boundary (off -> on: the chooser takes over)
        self._sampler_mode = mode  # the mode of self._sampler (_connect makes the first one in this mode)
        self._fresh = True  # the sampler's first iteration: every slot starts fresh
        self._auto: AutoAlpha | None = None
        self._choice: AlphaChoice | None = None  # the decision the iteration in flight samples with
        self._next_choice: AlphaChoice | None = None  # made while the learner updated, for the next boundary
        self.pending_settings: RunSettings | None = None
        self._unreported_changes: list[dict] = []
        self._last_learner_stats: dict | None = None
        self._in_iteration = False  # between the boundary that opened an iteration and its end
        self.pool = SimulatorPool(
            PoolTimeouts(
                step_s=config.step_timeout_s, reset_s=config.reset_timeout_s, describe_s=config.describe_timeout_s
            ),
            credentials=credentials,
            max_bad_answers=config.max_bad_answers,
            use_local_step=config.local_step,
        )
        self.runner: PolicyRunner | None = None
        self.learner = LearnerClient(
            config.learner, update_timeout_s=config.update_timeout_s, credentials=self.pool.credentials
        )
        self._pending_addresses: list[str] = []
        self._detached: set[str] = set()  # addresses DNS discovery must not bring back (until registered)
        # Pause and stop: at this broker's next boundary, or (learner ranks) one all brokers agree on.
        self.control = GroupControl()
        self._sampler: Sampler | None = None
        self._dealer: ClipDealer | None = None
        self._metrics_file = Path(config.run_dir) / METRICS_FILE if config.run_dir else None

    # -- control -------------------------------------------------------------------------
    def pause(self) -> None:
        """Finish the iteration in flight, then wait; the state reads PAUSING until that iteration is
        done, then PAUSED: a caller that sees PAUSED knows nothing more is sampled. With learner ranks,
        every broker pauses after the same iteration (broker/group_control.py)."""
        self.control.pause()

    def resume(self) -> None:
        self.control.resume()

    def stop(self) -> None:
        """Finish the iteration in flight, then end. With learner ranks, every broker ends after the same
        iteration (broker/group_control.py): one asked at a boundary, or while paused, samples one more."""
        self.control.stop()

    def fail(self, reason: str) -> None:
        """The run is over, unfinished: it hit an error, or its task was cancelled mid-iteration."""
        self._state, self._error = RunState.FAILED, reason

    def register(self, address: str) -> None:
        """Queue a simulator server; it joins at the next iteration boundary (a detached one too)."""
        self._detached.discard(address)
        self._pending_addresses.append(address)

    def update_settings(
        self,
        *,
        alpha: float | None = None,
        t_max: int | None = None,
        samples_per_iteration: int | None = None,
        alpha_auto: bool | None = None,
        mode: str | None = None,
    ) -> tuple[RunSettings, int]:
        """Accept new settings (None keeps one) for the next iteration boundary.

        Returns the settings that will be in force and the first iteration sampled with them.
        SettingError names a value out of range; ControlRefused when the run is over. Updates
        before one boundary add up: the last value given for each setting wins. A number for alpha
        turns alpha_auto off; alpha_auto true turns it on (from the next boundary's choice). A mode's
        name fixes the mode (mode_auto off); "auto" turns mode_auto on, from the mode in force.
        """
        if self.state.finished:
            raise ControlRefused(f"the run is {self.state.value}; its settings no longer change")
        base = self.pending_settings or self.settings
        self.pending_settings = base.updated(
            alpha=alpha, t_max=t_max, samples_per_iteration=samples_per_iteration, alpha_auto=alpha_auto, mode=mode
        )
        return self.pending_settings, self.next_boundary_iteration

    @property
    def next_boundary_iteration(self) -> int:
        """The first iteration that starts after the next boundary: the one in flight + 1."""
        return self.iteration + (2 if self._in_iteration else 1)

    def detach(self, address: str) -> ServerHandle:
        """Mark an attached simulator draining: its slots leave at the next iteration boundary.

        UnknownSimulator if it is not attached; ControlRefused if the run is over or if no other
        attached server (not draining, not dropped) would be left to sample with.
        """
        if self.state.finished:
            raise ControlRefused(f"the run is {self.state.value}; there is nothing to detach from")
        server = next((s for s in self.pool.servers if s.address == address), None)
        if server is None:
            raise UnknownSimulator(
                f"simulator {quote(address)} is not attached; GetRunStatus lists the attached ones by address"
            )
        others = [s for s in self.pool.servers if s is not server and not s.draining and not s.dropped]
        if not server.draining and not others:
            raise ControlRefused(
                f"simulator {quote(address)} is the last one left to sample with; register another "
                "(RegisterSimulator) and wait for it to join before detaching this one"
            )
        server.draining = True
        return server

    @property
    def active_slots(self) -> int:
        """Slots of the servers attached, not draining and not dropped: those the next iterations use."""
        return sum(s.num_slots for s in self.pool.servers if not s.draining and not s.dropped)

    @property
    def state(self) -> RunState:
        if self._state is RunState.RUNNING and not self.control.running.is_set():
            return RunState.PAUSING if self._in_iteration else RunState.PAUSED
        if self._state is RunState.RUNNING and self.control.pause_pending:
            return RunState.PAUSING
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
            while not self.control.stopped and (total == 0 or self.iteration < total):
                await self.control.running.wait()
                if self.control.stopped:
                    break
                await self._between_iterations()
                try:
                    await self._iterate()
                finally:
                    self._in_iteration = False
            self._state = RunState.DONE
        except (RunFailed, SamplingError, ConnectionError, ValueError) as exc:
            self.fail(str(exc))
            log.error("run failed: %s", exc)
        finally:
            self.history.close()  # watchers get the last iterations, then their streams end
            await self.pool.close()
            await self.learner.close()

    async def _connect(self) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        addresses = await self._first_addresses(deadline)
        for address in addresses:
            await self._retry_until(deadline, lambda a=address: self.pool.add(a), f"simulator {address}")
        obs_space, act_space = self.pool.observation_space, self.pool.action_space
        await self._retry_until(
            deadline, lambda: self.learner.initialize(obs_space, act_space), f"learner {self.config.learner}"
        )
        self.control.world_size = self.learner.world_size
        policy = await self.learner.get_policy()
        self.runner = PolicyRunner(obs_space, act_space, policy.hidden_sizes, seed=self.config.seed)
        self.runner.load(policy.version, policy.weights)
        if self._metrics_file is not None and self._metrics_file.exists():
            self._resume(policy.version, starting=True)
        locality = pool_locality(self.pool, self.config.locality_max_repeat) if self.config.locality else None
        if self.config.locality and locality is None:
            log.warning("locality is on, but the simulators do not list each clip's map: dealing without locality")
        self._dealer = ClipDealer(
            self.pool.num_clips, holdout_every=self.config.holdout_every, seed=self.config.seed, locality=locality
        )
        self._sampler = self._make_sampler()
        # alpha auto's window observes the iterations sampled in fast (any mode may become fast: UpdateSettings,
        # mode auto); it is cheap until asked to choose.
        c = self.config
        self._auto = AutoAlpha(
            c.alpha_min, c.alpha_max, *self._pool_shape(), c.t_max, c.samples_per_iteration, c.truncation
        )
        if self.settings.alpha_auto:
            self._choice = self._auto.choose()

    def _pool_shape(self) -> tuple[int, int]:
        """(servers, slots per server) of the attached servers, as the advisor's model takes them (even)."""
        servers = [s for s in self.pool.servers if not s.draining and not s.dropped] or self.pool.servers
        return len(servers), max(1, math.ceil(sum(s.num_slots for s in servers) / len(servers)))

    async def _first_addresses(self, deadline: float) -> list[str]:
        """The servers of `simulators` this broker drives: HOST:PORT entries, and its shard of each dns:///
        name's replicas (fast/addresses.py, Shard). A name that does not resolve yet, or whose replicas
        give this shard none, is read again until the start-up deadline: its replicas may be starting."""
        shard, specs = self.config.shard_rule, self.config.simulators
        while True:
            try:
                addresses = [a for spec in specs for a in resolve_shard(spec, shard)]
                problem = "" if addresses else f"shard {shard} keeps none of the replicas of {_replicas(specs)}"
                hint = " (broker I of N keeps the replicas whose IP % N == I: start more replicas, or fewer brokers)"
            except OSError as exc:
                problem, hint = f"cannot resolve {', '.join(specs)}: {exc}", ""
            if not problem:
                break
            if time.monotonic() + 1.0 > deadline:
                raise RunFailed(f"{problem} after {self.config.startup_timeout_s:g} s{hint}")
            await asyncio.sleep(1.0)
        if shard.count > 1:
            log.info("shard %s: %d simulator(s): %s", shard, len(addresses), ", ".join(addresses))
        return addresses

    async def _between_iterations(self) -> None:
        """The boundary: detached servers leave, registered ones join, pending settings take effect, mode
        auto chooses the mode; a new pool or a new mode gets a fresh sampler."""
        resized = await self._remove_detached_servers()
        resized = await self._admit_new_servers() or resized
        self._in_iteration = True
        before = self.settings
        if self.pending_settings is not None:
            new, self.pending_settings = self.pending_settings, None
            if new.alpha_auto and self.settings.alpha_auto:  # alpha is the choice's, not a change asked for
                new = replace(new, alpha=self.settings.alpha)
            if new.mode_auto and self.settings.mode_auto:  # the mode is the choice's
                new = replace(new, mode=self.settings.mode)
            self.settings = new
            log.info("settings from iteration %d: %s", self.iteration + 1, new.as_dict())
        self._choose_mode()
        # A mode's change is a settings change, the chooser's (probes included) as much as one asked for.
        self._unreported_changes += changes(before, self.settings)
        if resized or self.settings.mode != self._sampler_mode:
            # Global slot ids moved, or the mode changed: a fresh sampler (its live episodes restart).
            if self.settings.mode != self._sampler_mode:
                log.info("mode %s from iteration %d", self.settings.mode, self.iteration + 1)
            self._sampler = self._make_sampler()
        elif self.settings != before:
            s = self.settings
            self._sampler.apply_settings(samples_per_iteration=s.samples_per_iteration, alpha=s.alpha, t_max=s.t_max)
        self._choose_alpha()

    def _choose_mode(self) -> None:
        """mode auto: the chooser's mode for this boundary's iteration (it takes over from the mode in force
        when auto was just turned on, or at the run's start)."""
        if not self.settings.mode_auto:
            self._mode_choice, self._mode_choosing = None, False
            return
        if not self._mode_choosing:
            self._modes.take_over(self.settings.mode)
            self._mode_choosing = True
        self._mode_choice = self._modes.choose()
        if self._mode_choice.mode != self.settings.mode:
            self.settings = replace(self.settings, mode=self._mode_choice.mode)

    def _choose_alpha(self) -> None:
        """alpha auto: the choice made while the learner updated (the first boundary's: the prior) is in
        force from this boundary; an alpha choice is not a settings change (metrics' `alpha_auto` has it)."""
        if self._auto is None or not self.settings.alpha_auto:
            self._choice = None
            return
        choice, self._next_choice = self._next_choice or self._choice or self._auto.choose(), None
        self._choice = choice
        if choice.alpha != self.settings.alpha:
            self.settings = replace(self.settings, alpha=choice.alpha)
            s = self.settings
            self._sampler.apply_settings(samples_per_iteration=s.samples_per_iteration, alpha=s.alpha, t_max=s.t_max)

    async def _remove_detached_servers(self) -> bool:
        """Take the draining servers out of the pool (their last batch was submitted); True if any left."""
        draining = [s.address for s in self.pool.servers if s.draining]
        for address in draining:
            await self.pool.remove(address)
            self._detached.add(address)
            log.info("simulator %s detached", address)
        return bool(draining)

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
        c, s = self.config, self.settings
        self._sampler_mode, self._fresh = s.mode, True
        return make_sampler(
            s.mode,
            self.pool,
            self.runner,
            self._dealer,
            samples_per_iteration=s.samples_per_iteration,
            alpha=s.alpha,
            t_max=s.t_max,
            truncation=c.truncation,
            stall_timeout_s=c.stall_timeout_s,
            prefetch=c.prefetch,
            pipeline=c.pipeline,
        )

    async def _admit_new_servers(self) -> bool:
        """Servers registered at run time, or new IPs behind a DNS name, join between iterations.

        True if any joined. A detached address is not brought back by DNS, only by registering it. Of a
        name's replicas only this broker's shard joins (fast/addresses.py, Shard).
        """
        known = {s.address for s in self.pool.servers}
        candidates, self._pending_addresses = list(self._pending_addresses), []
        shard = self.config.shard_rule  # a new replica joins the one broker its address names
        for spec in self.config.simulators:
            if spec.startswith("dns:"):
                try:
                    candidates += [a for a in resolve_shard(spec, shard) if a not in self._detached]
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
        return joined

    async def _iterate(self) -> None:
        started = time.perf_counter()
        version = self.runner.version
        calls_before = replace(self.pool.counters)  # a copy: the iteration's calls are the difference
        batch, stats = await self._sampler.sample()
        sampling = stats.summary()
        pool_calls = asdict(self.pool.counters.since(calls_before))
        self._modes.observe(self._sampler_mode, stats.valid, stats.wall_s, first_after_switch=self._fresh)
        self._fresh = False
        deciding = self._decide_next_alpha(stats)
        requests = self.control.requests()
        try:
            reply = await self._submit(batch, version, requests)
        finally:
            self._next_choice = await _choice_of(deciding)
        if reply is None:  # stale: the learner moved on; sample again with its policy
            return
        self.control.agreed(requests, run_pauses=reply.run_pauses, run_stops=reply.run_stops)
        self.runner.load(reply.policy.version, reply.policy.weights)
        self.iteration += 1
        self.valid_total += stats.valid
        self.transitions_total += stats.transitions
        self.global_resets_total += stats.global_resets
        self.faults_total += stats.faults
        self.episode_lengths.observe(stats.episode_lengths)
        self.episode_returns.observe(stats.episode_returns)
        learner = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in reply.stats.items()}
        metrics = {
            "iteration": self.iteration,
            "policy_version": version,
            "time": time.time(),
            "iteration_time_s": time.perf_counter() - started,
            **sampling,
            # The servers' answers this iteration (step latency paid, map cache hits): with the costs,
            # the limit they put on the pattern sampled (jobs/bench/limits.py `line_limit`).
            "pool_calls": pool_calls,
            "learner": learner,
            "settings": self.settings.as_dict(),
        }
        if self._choice is not None and self.settings.mode == "fast":
            metrics["alpha_auto"] = self._choice.as_dict()
        if self._mode_choice is not None:
            metrics["mode_auto"] = self._mode_choice.as_dict(self.iteration)
        changed = self._unreported_changes + learner_changes(self._last_learner_stats, reply.stats)
        if changed:
            metrics["settings_changed"] = changed
        self._unreported_changes, self._last_learner_stats = [], dict(reply.stats)
        self.last_metrics = metrics
        self.history.append(metrics)
        if self._metrics_file is not None:
            self._metrics_file.parent.mkdir(parents=True, exist_ok=True)
            with self._metrics_file.open("a") as f:
                f.write(json.dumps(metrics, default=_json_default) + "\n")

    def _decide_next_alpha(self, stats: IterationStats) -> asyncio.Future | None:
        """alpha auto: this iteration's figures into the window, and the next alpha chosen in a thread
        while the learner updates on the batch (the model costs a fraction of a second; docs/advisor.md)."""
        if self._auto is None or stats.num_slots == 0 or self._sampler_mode != "fast":
            return None  # the window is fast's: another mode's rows, rounds and resets are not DPSA's
        self._auto.observe_iteration(stats)
        self._auto.servers, self._auto.slots_per_server = self._pool_shape()
        self._auto.samples_per_iteration = self.settings.samples_per_iteration
        self._auto.t_max = self.settings.t_max
        if not self.settings.alpha_auto:  # observed all the same: turned on later, it starts from the run so far
            return None
        return asyncio.ensure_future(asyncio.to_thread(self._auto.choose))

    async def _submit(self, batch: dict[str, np.ndarray], version: int, requests: Requests):
        deadline = time.monotonic() + self.config.learner_wait_s

        def before_wait(exc: grpc.aio.AioRpcError, delay_s: float) -> None:
            if self.control.stop_requested:
                raise RunFailed("stopped while waiting for the learner; the last batch was not learnt from") from None
            log.warning("learner unavailable (%s); retrying in %.1f s", exc.code().name, delay_s)

        try:
            return await retry(
                lambda: self.learner.submit(
                    batch, version, return_policy=True, pause_requested=requests.pause, stop_requested=requests.stop
                ),
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
        self.control.world_size = self.learner.world_size
        policy = await self._retry_learner(deadline, self.learner.get_policy)
        if policy.version == version:
            raise RunFailed(f"learner refused the batch: {refusal}")
        log.warning(
            "batch of version %d refused (%s); sampling again with version %d", version, refusal, policy.version
        )
        if policy.version < version:  # the learner restarted from an older checkpoint: its updates past it are lost
            self._resume(policy.version, starting=False)
        self.runner.load(policy.version, policy.weights)
        self.stale_batches += 1
        return None

    def _resume(self, version: int, *, starting: bool) -> None:
        """The learner is at `version`, resumed from its checkpoint (a broker restarted by its platform finds
        its run's metrics.jsonl; a running one finds its learner restarted older): the lines and held
        iterations of policy_version >= `version` are dropped, those updates being lost with the learner
        that made them, and the iterations are numbered on from the lines kept (broker/metrics_file.py), so
        that every version is recorded once. `fast train` has cut the files already and sets
        first_iteration, which a start keeps."""
        held = self.history.drop_from_version(version)
        cut = cut_file(self._metrics_file, version) if self._metrics_file is not None else None
        before = self.iteration
        if cut is not None:
            self.iteration = max(self.config.first_iteration, cut.kept) if starting else cut.kept
        else:
            self.iteration -= held
        dropped = cut.dropped if cut is not None else held
        if starting and not dropped and self.iteration == before:
            return
        log.warning(
            "resuming at policy version %d: %d iteration(s) past it dropped%s; iterations numbered on from %d",
            version,
            dropped,
            f" from {self._metrics_file}" if cut is not None else "",
            self.iteration,
        )

    async def _retry_learner(self, deadline: float, call):
        try:
            return await retry(call, deadline=deadline, delay_s=0.2, max_delay_s=5.0)
        except RetryExpired as expired:
            error = expired.error
        except grpc.aio.AioRpcError as exc:
            error = exc
        raise RunFailed(f"learner: {error.code().name}: {error.details()}")


async def _choice_of(deciding: asyncio.Future | None) -> AlphaChoice | None:
    """The decision made while the learner updated; None (the alpha in force stays) if there was none or
    the model failed on this window: a run does not stop for its advisor."""
    if deciding is None:
        return None
    try:
        return await deciding
    except (ValueError, ArithmeticError) as exc:
        log.warning("alpha auto: no choice this iteration, alpha stays: %s", exc)
        return None


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _replicas(specs: list[str]) -> str:
    """What the dns:/// names of `specs` resolve to, for a message."""
    names = [spec for spec in specs if spec.startswith("dns:")]
    return "; ".join(f"{spec} ({', '.join(resolve_addresses(spec)) or 'no address'})" for spec in names)

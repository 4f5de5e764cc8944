"""`fast train`: the whole local stack as processes on loopback, one training run, then a report.

Order of life:
0. with `simulators` (external servers, jobs/external.py): ask each its Describe with the
   environment's token, before anything starts; a refusal or a silent server ends the job (exit 2);
1. start K simulator servers (none with `simulators`) and the learner together, then the broker once they listen;
2. watch the broker (GetRunStatus ~2 Hz for the progress bar; metrics.jsonl to TensorBoard)
   until it exits, or until SIGINT/SIGTERM/SIGHUP; when a learner rank or a broker dies, stop every
   rank and broker and start them again from the newest checkpoint (`max_restarts` times at most;
   jobs/train/restart.py), then watch again;
3. stop the broker (it finishes its iteration), evaluate the final policy against a random one
   on the held-out clips while the simulators and the learner still run;
4. stop the learner (it writes a final checkpoint on SIGTERM), then the simulators;
5. write outcome.json and report.md with its plots.
Steps 4 and 5 run whatever happened before (try/finally), every wait is bounded, and every
child is SIGKILLed if SIGTERM does not end it in time. A second signal skips the evaluation.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml
from rich.console import Console

from broker.dealer import HOLDOUT_EVERY
from broker.wire import metrics_from_proto
from fast.files import write_text_atomic
from fast.lifecycle import exit_with_parent
from jobs import processes
from jobs.external import EXTERNAL_WAIT_S, ExternalSimulatorError, ExternalSimulators, check_simulators
from jobs.tokens import JobToken, write_job_token
from jobs.train.config import SIMULATOR_SETTINGS, TrainConfig
from jobs.train.monitor import BrokerStatus, MetricsTail, ProgressView, TensorBoardSink
from jobs.train.report import ReportError, write_report

POLL_S = 0.5  # status polling period (~2 Hz)
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_BROKER_TAIL_LINES = 20
_RENDEZVOUS = re.compile(r"rendezvous at \S+:(\d+),")  # learner rank 0's line (learner/server.py)
_LISTENING_VERSION = re.compile(r"fast learner listening on \S+ .*\bversion=(\d+)")  # the version it resumed


def _launch(name: str, args: list[str], env: dict[str, str] | None = None) -> processes.Launch:
    # Every child in a session of its own: a terminal's Ctrl-C reaches only `fast train`,
    # which stops them in its order (docs/train.md).
    return processes.launch(name, args, env, new_session=True)


class TrainError(RuntimeError):
    """`fast train` cannot start as configured; the message says what to change."""


class _Signals:
    """Signals to `fast train` itself. The first asks for a graceful stop (polled by the loop);
    a second one during the evaluation raises KeyboardInterrupt to skip it."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.escalate = False  # raise on a further signal (only where a blocking call must be cut)
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        self.received.append(signum)
        if self.escalate and len(self.received) >= 2:
            self.escalate = False
            raise KeyboardInterrupt

    def install(self) -> None:
        try:
            self._previous = {sig: signal.signal(sig, self._handle) for sig in _STOP_SIGNALS}
        except ValueError:  # not the main thread (train() called from a library thread): none to catch
            self._previous = {}

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @property
    def first(self) -> int | None:
        return self.received[0] if self.received else None


def prepare_run_dir(run_dir: Path) -> None:
    """A fresh directory: the broker appends metrics and the learner resumes from checkpoints,
    so reusing a run's directory would silently mix two runs."""
    if run_dir.exists() and any(run_dir.iterdir()):
        raise TrainError(f"{run_dir} already holds a run; pick another --name, or remove the directory to start over")
    run_dir.mkdir(parents=True, exist_ok=True)


class TrainingRun:
    """The processes of one run and what is learnt about them; `train` drives it."""

    def __init__(
        self, cfg: TrainConfig, console: Console, signals: _Signals, external: ExternalSimulators | None = None
    ) -> None:
        self.cfg = cfg
        self.external = external  # simulators started elsewhere: used, never started or stopped here
        self.console = console
        self.signals = signals
        self.run_dir = cfg.run_dir.resolve()
        self.started_at = datetime.now(timezone.utc)
        self.sims: list[processes.Launch] = []
        self.learner: processes.Launch | None = None
        self.broker: processes.Launch | None = None
        # With ranks > 1: learner ranks 1.. and their brokers ("learner-1", "broker-1", ...); rank 0's are above.
        self.other_learners: list[processes.Launch] = []
        self.other_brokers: list[processes.Launch] = []
        self.gateway: processes.Launch | None = None
        self.initial_policy = None  # version 0's weights, for the evaluation
        self.addresses: dict[str, str] = {}
        # The run's own token (runs/<name>/token), made by start(); with external simulators the environment's.
        self.token: JobToken | None = external.token if external is not None else None
        self.evaluation_note = ""  # why the evaluation cannot run (too few clips to hold any out)
        self.iterations_done = 0
        self.broker_error = ""  # the broker's own account (GetRunStatus.error)
        self.failure = ""  # what else ended the run (a service that died)
        self.died = ""  # which process of the group (a learner rank or a broker) died, and how
        self.restarts: list[dict] = []  # one record per restart of the group (outcome.json)
        self._tail = MetricsTail(self.run_dir / "metrics.jsonl")
        self._tb: TensorBoardSink | None = None

    # -- start ---------------------------------------------------------------------------
    def start(self) -> None:
        cfg = self.cfg
        deadline = time.monotonic() + cfg.startup_timeout_s
        stopping = lambda: bool(self.signals.received)  # noqa: E731
        if self.external is None:
            # A fresh token per run, in a file only its user can read; the services get its path.
            self.token = write_job_token(self.run_dir / "token")
        # Each service from its config (TrainConfig's *_config, fast/settings.py: to_argv), never flags by hand.
        sim_server = cfg.sim_server_config()
        for i in range(0 if self.external is not None else cfg.servers):
            self.sims.append(_launch(f"sim-server-{i}", ["sim-server", *sim_server.to_argv()], env=self.token.env))
        self._launch_learners(deadline, stopping)
        self.write_config()
        # The TensorBoard event file, opened while the children start up (tensorboard's writer, a tenth of a
        # second to import; no torch: nothing in this process imports torch on a normal run, jobs/train/monitor.py).
        self._tb = TensorBoardSink(self.run_dir / "tb")
        for child in [*self.sims, self.learner, *self.other_learners]:
            self.addresses[child.name] = processes.wait_listening(child, deadline, stopping).address
        if self.external is not None:
            from jobs.train.evaluation import holdout_note

            self.evaluation_note = holdout_note(self.external.num_clips, HOLDOUT_EVERY)
            if self.evaluation_note and cfg.eval_episodes_per_clip > 0:
                self.console.print(f"note: {self.evaluation_note}", highlight=False)
        if cfg.eval_episodes_per_clip > 0 and not self.evaluation_note:
            from jobs.train.evaluation import capture_initial_policy

            self.initial_policy = asyncio.run(
                capture_initial_policy(self.simulator_addresses()[0], self.addresses["learner"], self.token.credentials)
            )
        self._launch_brokers(deadline, stopping, first_iteration=0)
        self.write_config()  # the broker samples already: its pid is on record before the gateway's start
        if cfg.gateway:
            self.start_gateway(deadline, stopping)
        self.write_config()

    def _launch_learners(self, deadline: float, stopping) -> None:
        """Learner rank 0, then (with ranks > 1) ranks 1.. at the rendezvous it prints; not waited for."""
        cfg = self.cfg
        learner = cfg.learner_config(self.run_dir)
        self.learner = _launch("learner", ["learner", *learner.to_argv()], env=self.token.env)
        self.other_learners = []
        if cfg.ranks > 1:
            # Rank 0 binds the group's rendezvous on loopback at a free port and prints it; the others join there.
            port = int(processes.wait_for_line(self.learner, _RENDEZVOUS, deadline, stopping).group(1))
            self.other_learners = [
                _launch(
                    f"learner-{rank}",
                    ["learner", *cfg.learner_config(self.run_dir, rank=rank, master_port=port).to_argv()],
                    env=self.token.env,
                )
                for rank in range(1, cfg.ranks)
            ]

    def _launch_brokers(self, deadline: float, stopping, first_iteration: int) -> None:
        """A broker per learner rank (the learners listening), waited for until each listens."""
        cfg = self.cfg
        # External ones as given: the broker resolves dns:/// itself, again when it re-admits a server.
        simulators = list(cfg.simulators) if self.external is not None else self.simulator_addresses()
        # Rank r's broker drives servers r, r + R, r + 2R, ... (or its shard of a dns:/// name's replicas) and
        # feeds learner rank r; rank 0's writes the run's metrics.jsonl, the others rank-<r>/metrics.jsonl.
        shards = [cfg.broker_simulators(simulators, rank) for rank in range(cfg.ranks)]
        self.broker, self.other_brokers = None, []
        for rank in range(cfg.ranks):
            name = "broker" if rank == 0 else f"broker-{rank}"
            config = cfg.broker_config(
                shards[rank][0],
                self.addresses["learner" if rank == 0 else f"learner-{rank}"],
                self._broker_run_dir(rank),
                HOLDOUT_EVERY,
                rank,
                first_iteration,
                shards[rank][1],
            )
            child = _launch(name, ["broker", *config.to_argv()], env=self.token.env)
            if rank == 0:
                self.broker = child
            else:
                self.other_brokers.append(child)
        for child in [self.broker, *self.other_brokers]:
            self.addresses[child.name] = processes.wait_listening(child, deadline, stopping).address

    def _broker_run_dir(self, rank: int) -> Path:
        return self.run_dir if rank == 0 else self.run_dir / f"rank-{rank}"

    def simulator_addresses(self) -> list[str]:
        """HOST:PORT of every simulator server of the run: the external ones, or those it started."""
        if self.external is not None:
            return self.external.addresses
        return [self.addresses[s.name] for s in self.sims if s.name in self.addresses]

    def start_gateway(self, deadline: float, stopping) -> None:
        """The REST gateway beside the run, over every broker and learner rank; its URL is printed once, with
        the token in its fragment (never sent to the server) so that the dashboard's buttons work from that link."""
        brokers = [self.addresses[b.name] for b in [self.broker, *self.other_brokers]]
        learners = [self.addresses[learner.name] for learner in [self.learner, *self.other_learners]]
        gateway = self.cfg.gateway_config(brokers, learners)
        self.gateway = _launch("gateway", ["gateway", *gateway.to_argv()], env=self.token.env)
        url = processes.wait_listening(self.gateway, deadline, stopping).address
        self.addresses["gateway"] = url
        if self.token.inherited:  # the user's own token: never printed; they know where it is
            self.console.print(
                f"gateway: {url}  (the dashboard's buttons and REST calls that steer the run need the token of "
                f"{self.token.source}: open {url}/#token=<token>)",
                highlight=False,
                soft_wrap=True,
            )
            return
        self.console.print(
            f"gateway: {url}  (dashboard: {url}/#token={self.token.credentials.token} ; "
            f"REST calls that steer the run need 'Authorization: Bearer $(cat {self.token.path})')",
            highlight=False,
            soft_wrap=True,
        )

    def children(self) -> list[processes.Launch]:
        """Every child, in stopping order: gateway, brokers, learners, simulators."""
        brokers, learners = [self.broker, *self.other_brokers], [self.learner, *self.other_learners]
        return [c for c in [self.gateway, *brokers, *learners, *self.sims] if c is not None]

    def write_config(self) -> None:
        """config.yaml: the resolved settings, and each process's pid, address and exact command."""
        document = {
            # With external simulators, the settings of simulators it would start are left out: none applies.
            "train": self.cfg.model_dump(mode="json", exclude=set(SIMULATOR_SETTINGS) if self.external else None),
            "run_dir": str(self.run_dir),
            "started_at": self.started_at.isoformat(timespec="seconds"),
            "holdout_every": HOLDOUT_EVERY,
            **({"simulators": self.external.record()} if self.external is not None else {}),
            "processes": {
                c.name: {"pid": c.process.pid, "address": self.addresses.get(c.name), "command": c.shell_line()}
                for c in reversed(self.children())
            },
        }
        # Rewritten as processes start and restart, and read meanwhile: never half a file.
        write_text_atomic(self.run_dir / "config.yaml", yaml.safe_dump(document, sort_keys=False))

    # -- watch ---------------------------------------------------------------------------
    def watch(self) -> str:
        """Follow the broker until it exits ("done" / "failed") or a signal arrives ("interrupted")."""
        status = BrokerStatus(self.addresses["broker"], self.token.credentials)
        last: dict | None = None
        reported_dead: set[str] = set()
        try:
            with ProgressView(self.console, self.cfg.iterations, self.cfg.mode) as view:
                while True:
                    last = self._drain_metrics() or last
                    reply = status.poll()
                    if reply is not None:
                        self.broker_error = reply.error or self.broker_error
                        if reply.HasField("last_metrics") and reply.iteration >= self.iterations_done:
                            last = metrics_from_proto(reply.last_metrics)
                    view.update(max(self.iterations_done, reply.iteration if reply else 0), last)
                    if self.signals.received:
                        return "interrupted"
                    brokers = [self.broker, *self.other_brokers]
                    codes = [broker.process.poll() for broker in brokers]
                    failed = [(b.name, c) for b, c in zip(brokers, codes) if c not in (None, 0)]
                    if failed or all(c == 0 for c in codes):  # with ranks, one failed broker fails the run
                        last = self._drain_metrics() or last
                        view.update(self.iterations_done, last)
                        self.died = ", ".join(f"{name} exited with code {code}" for name, code in failed)
                        return "failed" if failed else "done"
                    for sim in self.sims:
                        if sim.process.poll() is not None and sim.name not in reported_dead:
                            reported_dead.add(sim.name)
                            view.note(
                                f"{sim.name} exited with code {sim.process.returncode}; the broker carries on "
                                "with the other servers"
                            )
                    for learner in [self.learner, *self.other_learners]:
                        if learner.process.poll() is not None:
                            self.died = f"{learner.name} exited with code {learner.process.returncode}"
                            self.failure = f"the {self.died}: " + " | ".join(learner.lines[-10:])
                            return "failed"
                    time.sleep(POLL_S)
        finally:
            status.close()

    def _drain_metrics(self) -> dict | None:
        last = None
        for metrics in self._tail.read_new():
            if self._tb is not None:
                self._tb.write(metrics)
            self.iterations_done = max(self.iterations_done, int(metrics["iteration"]))
            last = metrics
        return last

    # -- restart -------------------------------------------------------------------------
    def restart_group(self) -> None:
        """torchrun's --max-restarts on this machine: stop every learner rank and broker that is left (and the
        gateway, which is given their addresses), then start them all again. The learners resume from the
        newest checkpoint that every broker's metrics reach (jobs/train/restart.py), lines past it are
        dropped, and the brokers count their iterations on from that version; the simulators keep running."""
        from broker.metrics_file import drop_lines_from  # only on a restart
        from jobs.train.restart import choose_resume_point

        cfg = self.cfg
        began = time.monotonic()
        self.console.print(
            f"restarting the group ({len(self.restarts) + 1} of at most {cfg.max_restarts}): {self.died}",
            highlight=False,
        )
        record = {"cause": self.died, "exit_codes": self._stop_group(), "stop_s": round(time.monotonic() - began, 3)}
        self.restarts.append(record)  # on record even if the group fails to start again
        metrics_files = [self._broker_run_dir(rank) / "metrics.jsonl" for rank in range(cfg.ranks)]
        point = choose_resume_point(self.run_dir / "checkpoints", metrics_files)
        deadline = time.monotonic() + cfg.startup_timeout_s
        stopping = lambda: bool(self.signals.received)  # noqa: E731
        self._launch_learners(deadline, stopping)
        for learner in [self.learner, *self.other_learners]:
            self.addresses[learner.name] = processes.wait_listening(learner, deadline, stopping).address
        version = self._resumed_version()
        dropped = {str(path.relative_to(self.run_dir)): drop_lines_from(path, version) for path in metrics_files}
        self._tail.follow_truncation()
        self.iterations_done = version
        self._launch_brokers(deadline, stopping, first_iteration=version)
        self.write_config()
        if cfg.gateway:
            self.start_gateway(deadline, stopping)
            self.write_config()
        record.update(
            resumed_version=version,
            checkpoints_set_aside=point.set_aside,
            metrics_lines_dropped=dropped,
            **({"gap": point.gap} if point.gap else {}),
            restart_s=round(time.monotonic() - began, 3),  # stopped (stop_s), then serving again
        )
        self.died, self.failure, self.broker_error = "", "", ""
        aside = f"; checkpoints {point.set_aside} set aside (no metrics line reaches them)" if point.set_aside else ""
        self.console.print(
            f"group restarted: every rank resumed from policy version {version}, the brokers sample on from "
            f"iteration {version + 1}; metrics lines dropped (to be redone): {sum(dropped.values())}{aside}"
            + (f"; {point.gap}" if point.gap else ""),
            highlight=False,
        )

    def _stop_group(self) -> dict[str, int | None]:
        """Gateway, brokers (little time: their iteration cannot be learnt from), then every learner rank at
        once (rank 0 writes its final checkpoint; a rank stuck in a collective is freed when the others
        leave). Returns their exit codes."""
        group = [self.broker, *self.other_brokers, self.learner, *self.other_learners]
        if self.gateway is not None:
            processes.stop(self.gateway, self.cfg.stop_timeout_s)
            self.gateway = None
        for members, timeout_s in (
            (group[: self.cfg.ranks], min(5.0, self.cfg.stop_timeout_s)),
            (group[self.cfg.ranks :], self.cfg.stop_timeout_s),
        ):
            for child in members:
                if child.process.poll() is None:
                    child.process.send_signal(signal.SIGTERM)
            for child in members:
                processes.stop(child, timeout_s)
        return {child.name: child.process.returncode for child in group}

    def _resumed_version(self) -> int:
        """The policy version learner rank 0 says it resumed (its listening line; every rank agreed on it)."""
        for line in self.learner.lines:
            match = _LISTENING_VERSION.search(line)
            if match:
                return int(match.group(1))
        raise processes.StartupError(f"learner printed no version in its listening line: {self.learner.lines[-5:]}")

    # -- stop ----------------------------------------------------------------------------
    def stop_broker(self, keep_iteration: bool) -> None:
        """SIGTERM the brokers: each finishes its iteration (bounded) when keep_iteration, else it gets
        little time, since after a failure its iteration cannot be submitted anyway. With ranks, all are
        signalled first: a rank's last update waits for every broker's batch."""
        brokers = [b for b in [self.broker, *self.other_brokers] if b is not None and b.process.poll() is None]
        if brokers:
            timeout_s = self.cfg.stop_timeout_s if keep_iteration else min(5.0, self.cfg.stop_timeout_s)
            self.console.print(f"stopping the broker (at most {timeout_s:g} s)", highlight=False)
            for broker in brokers:
                broker.process.send_signal(signal.SIGTERM)
            for broker in brokers:
                processes.stop(broker, timeout_s)
        self._drain_metrics()

    def stop_all(self) -> None:
        """Broker, learner (final checkpoint), simulators; each SIGTERM then SIGKILL, bounded."""
        for child in self.children():
            processes.stop(child, self.cfg.stop_timeout_s)
        self._drain_metrics()
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    # -- evaluate ------------------------------------------------------------------------
    def evaluate(self) -> dict:
        from jobs.train.evaluation import evaluate_run  # only imported when a run gets this far

        cfg = self.cfg
        if self.evaluation_note:
            self.console.print(f"evaluation skipped: {self.evaluation_note}", highlight=False)
            result = {"skipped": self.evaluation_note, "holdout_every": HOLDOUT_EVERY}
            (self.run_dir / "eval.json").write_text(json.dumps(result, indent=1))
            return result
        self.console.print(
            f"evaluating the final policy and a random one on the held-out clips "
            f"({cfg.eval_episodes_per_clip} episode(s) per clip; Ctrl-C again to skip)",
            highlight=False,
        )
        alive = (
            self.external.addresses
            if self.external is not None
            else [self.addresses[s.name] for s in self.sims if s.process.poll() is None]
        )
        if not alive:
            raise RuntimeError("no simulator server is left to evaluate on")
        result = asyncio.run(
            evaluate_run(
                alive,
                self.addresses["learner"],
                self.run_dir / "checkpoints",
                episodes_per_clip=cfg.eval_episodes_per_clip,
                holdout_every=HOLDOUT_EVERY,
                seed=cfg.seed,
                initial=self.initial_policy,
                credentials=self.token.credentials,
            )
        )
        (self.run_dir / "eval.json").write_text(json.dumps(result, indent=1))
        return result


def train(cfg: TrainConfig, console: Console | None = None) -> int:
    """Run one training job; returns the exit code (0 done, 1 failed, 128+signal if stopped)."""
    console = console or Console(soft_wrap=True)  # log lines stay whole when not on a terminal
    prepare_run_dir(cfg.run_dir)
    external = None
    if cfg.simulators:  # asked before anything starts: a wrong address or token is a setting to fix (exit 2)
        try:
            external = check_simulators(cfg.simulators, wait_s=min(cfg.startup_timeout_s, EXTERNAL_WAIT_S))
        except ExternalSimulatorError as exc:
            raise TrainError(str(exc)) from None
    signals = _Signals()
    signals.install()
    # Started by a FAST job (`fast bench train`): once that job is gone, even SIGKILLed, stop as on
    # SIGTERM (the stack stopped in order, the last iteration checkpointed) instead of running on.
    exit_with_parent()
    run = TrainingRun(cfg, console, signals, external)
    clock = time.perf_counter()
    timings: dict[str, float] = {}
    outcome, error = "failed", ""
    try:
        simulators = (
            external.describe() if external is not None else f"{cfg.servers} simulator server(s) x {cfg.slots} slots"
        )
        console.print(
            f"fast train: {simulators}, mode {cfg.mode}, "
            f"{cfg.iterations} iterations of {cfg.samples_per_iteration} samples"
            + (f" on each of {cfg.ranks} broker/learner ranks" if cfg.ranks > 1 else "")
            + f" -> {run.run_dir}",
            highlight=False,
        )
        run.start()
        timings["startup_s"] = time.perf_counter() - clock
        outcome = run.watch()
        # torchrun's --max-restarts: a learner rank or a broker that died restarts the whole group (docs/scaling.md).
        while outcome == "failed" and run.died and len(run.restarts) < cfg.max_restarts and not signals.received:
            run.restart_group()
            outcome = run.watch()
        timings["training_s"] = time.perf_counter() - clock - timings["startup_s"]
        if outcome == "interrupted":
            console.print(f"{signal.Signals(signals.first).name} received: stopping", highlight=False)
        run.stop_broker(keep_iteration=outcome != "failed")
        if outcome == "failed":
            error = run.failure or f"the broker failed: {run.broker_error or 'see its output'}"
        elif len(signals.received) > 1:
            console.print("evaluation skipped (a second signal)", highlight=False)
        elif cfg.eval_episodes_per_clip > 0 and run.iterations_done > 0:
            began = time.perf_counter()
            signals.escalate = True
            try:
                result = run.evaluate()
            finally:
                signals.escalate = False
            timings["evaluation_s"] = time.perf_counter() - began
            if "trained" in result:
                _print_evaluation(console, result)
    except processes.StartupError as exc:
        outcome, error = ("interrupted" if signals.received else "failed"), str(exc)
    except KeyboardInterrupt:
        outcome = "interrupted"
        console.print("evaluation skipped", highlight=False)
    except Exception as exc:  # evaluation or a file write: the processes still need stopping, and the user a reason
        outcome, error = "failed", f"{type(exc).__name__}: {exc}"
    finally:
        began = time.perf_counter()
        run.stop_all()
        timings["shutdown_s"] = time.perf_counter() - began
        signals.restore()
    code = {"done": 0, "failed": 1}.get(outcome, 128 + (signals.first or signal.SIGINT))
    if outcome == "failed":
        console.print(f"[red]fast train failed[/]: {error}", highlight=False)
        if run.broker is not None:
            console.print(
                "broker's last lines:\n  " + "\n  ".join(run.broker.lines[-_BROKER_TAIL_LINES:]), highlight=False
            )
    _write_outcome(run, outcome, code, error, timings, time.perf_counter() - clock)
    try:
        report = write_report(run.run_dir)
        console.print(f"report: {report}", highlight=False)
    except ReportError as exc:
        console.print(f"no report: {exc}", highlight=False)
    return code


def _write_outcome(run: TrainingRun, outcome: str, code: int, error: str, timings: dict, wall_s: float) -> None:
    document = {
        "outcome": outcome,
        "exit_code": code,
        "error": error,
        "iterations": run.iterations_done,
        "started_at": run.started_at.isoformat(timespec="seconds"),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_clock_s": wall_s,
        **timings,
        "exit_codes": {c.name: c.process.returncode for c in run.children()},
        "restarts": run.restarts,
    }
    (run.run_dir / "outcome.json").write_text(json.dumps(document, indent=1))


def _print_evaluation(console: Console, result: dict) -> None:
    trained, random = result["trained"]["summary"], result["random"]["summary"]
    initial = result.get("initial", {}).get("summary", {})

    def row(key: str) -> str:
        values = [trained.get(key), initial.get(key), random.get(key)]
        return " vs ".join("-" if v is None else f"{v:.3f}" for v in values)

    console.print(
        f"evaluation ({trained.get('episodes', 0)} episodes each), trained vs initial vs random: "
        f"return {row('return_mean')}, collision rate {row('collided_rate')}, "
        f"off-road rate {row('off_road_rate')}, length {row('length_mean')}",
        highlight=False,
    )


__all__ = ["TrainError", "TrainingRun", "prepare_run_dir", "train"]

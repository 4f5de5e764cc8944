"""One chaos run: the stack of real processes behind the proxies (Stack), the faults it suffers on
schedule (Injector), and `run_once`, which runs both and hands the records to the analysis."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks.chaos_analysis import analyse
from benchmarks.chaos_plan import ChaosConfig, Fault
from benchmarks.chaos_proxies import LearnerProxy, Ledger, SimulatorProxy
from jobs import processes
from jobs.tokens import JobToken


def _flags(values: dict) -> list[str]:
    return [part for name, value in values.items() for part in (f"--{name}", str(value))]


class Stack:
    """The processes and proxies of one run; every process it ever launched is stopped by `shutdown`."""

    def __init__(self, cfg: ChaosConfig, token: JobToken, work: Path, ledger: Ledger, log) -> None:
        self.cfg, self.token, self.work, self.ledger, self.log = cfg, token, work, ledger, log
        self.launched: list[processes.Launch] = []
        self.sims: list[processes.Launch] = []
        self.sim_ports: list[int] = []
        self.sim_proxies: list[SimulatorProxy] = []
        self.learner: processes.Launch | None = None
        self.learner_port = 0
        self.learner_proxy: LearnerProxy | None = None
        self.broker: processes.Launch | None = None
        self.frozen: set[int] = set()  # pids SIGSTOPped and not yet SIGCONTed
        self.left_running: list[str] = []  # after shutdown: should stay empty
        self.t0 = time.monotonic()

    def _launch(self, name: str, args: list[str], env: dict[str, str]) -> processes.Launch:
        child = processes.launch(name, args, {**self.token.env, **env}, new_session=True)
        self.launched.append(child)
        return child

    async def _listening(self, child: processes.Launch, timeout_s: float = 90.0) -> str:
        service = await asyncio.to_thread(processes.wait_listening, child, time.monotonic() + timeout_s)
        return service.address

    def _sim(self, i: int, port: int) -> processes.Launch:
        c = self.cfg
        flags = {"env": "takeover", "slots": c.slots, "host": "127.0.0.1", "port": port, "cost-preset": c.preset}
        return self._launch(f"sim-{i}", ["sim-server", *_flags(flags)], {})

    def _learner(self, port: int) -> processes.Launch:
        c = self.cfg
        flags = {
            "host": "127.0.0.1",
            "port": port,
            "checkpoint-dir": self.work / "checkpoints",
            "seed": c.seed,
            "update-epochs": c.update_epochs,
            "num-minibatches": c.num_minibatches,
            "checkpoint-every": c.checkpoint_every,
            "keep-checkpoints": c.iterations + 10,  # every version stays on disk: the sequence is checked
        }
        return self._launch("learner", ["learner", *_flags(flags)], {})

    async def start(self) -> None:
        c = self.cfg
        self.sims = [self._sim(i, 0) for i in range(c.servers)]
        self.learner = self._learner(0)
        addresses = await asyncio.gather(*(self._listening(x) for x in [*self.sims, self.learner]))
        self.sim_ports = [int(a.rsplit(":", 1)[1]) for a in addresses[:-1]]
        self.learner_port = int(addresses[-1].rsplit(":", 1)[1])
        for i, address in enumerate(addresses[:-1]):
            proxy = SimulatorProxy(i, address, self.ledger, c.seed * 1000 + i, max(0, c.max_bad_answers - 1))
            await proxy.start()
            self.sim_proxies.append(proxy)
        self.learner_proxy = LearnerProxy(addresses[-1], self.ledger)
        await self.learner_proxy.start()
        # The broker's deadlines, the way a deployment sets them (broker/config.py).
        env = {
            f"FAST_BROKER_{name.upper()}": repr(getattr(c, name))
            for name in (
                "step_timeout_s",
                "reset_timeout_s",
                "describe_timeout_s",
                "stall_timeout_s",
                "learner_wait_s",
                "update_timeout_s",
                "max_bad_answers",
            )
        }
        # Every Step must cross the proxies, where the faults are made and the ledger is kept: the
        # local step socket a server names in Describe (broker/config.py, on by default) would go round them.
        env["FAST_BROKER_LOCAL_STEP"] = "false"
        flags = {
            "simulators": ",".join(p.address for p in self.sim_proxies),
            "learner": self.learner_proxy.address,
            "mode": "fast",
            "samples-per-iteration": c.samples,
            "iterations": c.iterations,
            "seed": c.seed,
            "run-dir": self.work,
            "host": "127.0.0.1",
            "port": 0,
        }
        args = ["broker", *_flags(flags)]
        self.broker = self._launch("broker", args, env)
        await self._listening(self.broker)
        self.t0 = time.monotonic()

    # -- faults ---------------------------------------------------------------------------------
    async def kill_sim(self, i: int) -> dict:
        t = time.monotonic()
        self.sims[i].process.kill()
        await self.sim_proxies[i].close()
        await asyncio.to_thread(self.sims[i].process.wait, 10)
        self.sims[i] = self._sim(i, self.sim_ports[i])
        await self._listening(self.sims[i])
        back = time.monotonic()
        await self.sim_proxies[i].start()
        return {"t_fault": t, "t_resumed": time.monotonic(), "restart_s": back - t}

    async def stop_sim(self, i: int, duration_s: float) -> dict:
        pid = self.sims[i].process.pid
        t = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        self.frozen.add(pid)
        try:
            await asyncio.sleep(duration_s)
        finally:
            os.kill(pid, signal.SIGCONT)
            self.frozen.discard(pid)
        return {"t_fault": t, "t_resumed": time.monotonic(), "stopped_s": duration_s}

    async def kill_learner(self) -> dict:
        in_flight = any(b["outcome"] == "pending" for b in self.ledger.batches)
        t = time.monotonic()
        self.learner.process.kill()
        await self.learner_proxy.close()
        await asyncio.to_thread(self.learner.process.wait, 10)
        self.learner = self._learner(self.learner_port)
        await self._listening(self.learner)
        back = time.monotonic()
        await self.learner_proxy.start()
        return {"t_fault": t, "t_resumed": time.monotonic(), "restart_s": back - t, "batch_in_flight": in_flight}

    # -- the end --------------------------------------------------------------------------------
    async def shutdown(self) -> dict[str, int | None]:
        """Every process launched, broker first, then the learner (final checkpoint), then simulators."""
        for pid in list(self.frozen):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.frozen.clear()
        codes: dict[str, int | None] = {}
        order = sorted(self.launched, key=lambda x: {"broker": 0, "learner": 1}.get(x.name, 2))
        for child in order:
            # In a thread: the broker finishing its iteration still needs the proxies to answer.
            code = await asyncio.to_thread(processes.stop, child, 15.0)
            if child is self.broker or child is self.learner or any(child is s for s in self.sims):
                codes[child.name] = code
        for proxy in [*self.sim_proxies, self.learner_proxy]:
            if proxy is not None:
                await proxy.close()
        self.left_running = [f"{c.name} (pid {c.process.pid})" for c in self.launched if c.process.poll() is None]
        return codes


class Injector:
    """Runs the plan: one task per target, its faults in order, each after the target recovered.

    Simulators' faults may overlap one another; the learner's kill does not overlap any of them
    (it waits for them to end and holds theirs until the learner answers again), so that each
    recovery time measures one fault and not a simulator waiting on the learner.
    """

    def __init__(self, stack: Stack, plan: list[Fault], cfg: ChaosConfig, log) -> None:
        self.stack, self.plan, self.cfg, self.log = stack, plan, cfg, log
        self.done = asyncio.Event()  # the broker exited
        self.sim_faults_open = 0  # simulator faults injected and not yet recovered
        self.learner_down = False

    async def run(self) -> None:
        targets = sorted({f.target for f in self.plan})
        await asyncio.gather(*(self._target([f for f in self.plan if f.target == t]) for t in targets))

    async def _until(self, condition, timeout_s: float | None = None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not condition():
            if self.done.is_set() or (deadline is not None and time.monotonic() > deadline):
                return condition()
            await asyncio.sleep(0.05)
        return True

    def _recovered(self, target: int, since: float) -> bool:
        ledger = self.stack.ledger
        times = ledger.learner_ok if target < 0 else ledger.good_steps[target]
        return bool(times) and times[-1] > since

    async def _target(self, faults: list[Fault]) -> None:
        ledger = self.stack.ledger
        since = 0.0
        for fault in faults:
            await self._until(lambda f=fault: ledger.accepted >= f.at_iteration)
            await self._until(lambda: False, fault.delay_s)
            await self._until(lambda: self._recovered(fault.target, since), self.cfg.recovery_wait_s)
            if fault.target < 0:
                self.learner_down = True  # no new simulator fault from here ...
                await self._until(lambda: self.sim_faults_open == 0, 2 * self.cfg.recovery_wait_s)
            else:
                await self._until(lambda: not self.learner_down)
            if self.done.is_set():
                ledger.faults.append({**asdict(fault), "injected": False})
                self.learner_down = False
                continue
            event = {**asdict(fault), "injected": True, "iteration": ledger.accepted}
            if fault.target >= 0:
                self.sim_faults_open += 1
            try:
                if fault.kind == "sim-kill":
                    event.update(await self.stack.kill_sim(fault.target))
                elif fault.kind == "sim-stop":
                    event.update(await self.stack.stop_sim(fault.target, fault.duration_s))
                elif fault.kind == "garbage":
                    proxy = self.stack.sim_proxies[fault.target]
                    proxy.start_garbage(fault.duration_s, self.cfg.garbage_rate)
                    t = time.monotonic()
                    await self._until(lambda: False, fault.duration_s)
                    event.update(t_fault=t, t_resumed=time.monotonic())
                else:
                    if self.cfg.learner_kill_in_update:
                        pending = lambda: any(b["outcome"] == "pending" for b in ledger.batches)  # noqa: E731
                        await self._until(pending, 60)
                        await asyncio.sleep(fault.duration_s)
                    event.update(await self.stack.kill_learner())
                since = event["t_resumed"]
                ledger.faults.append(event)
                self.log(
                    f"  {event['t_fault'] - self.stack.t0:7.1f} s  {fault.kind:12s} "
                    f"{'learner' if fault.target < 0 else f'sim-{fault.target}'} at iteration {event['iteration']}, "
                    f"back after {event['t_resumed'] - event['t_fault']:.1f} s"
                )
                await self._until(lambda: self._recovered(fault.target, since), self.cfg.recovery_wait_s)
            finally:
                if fault.target >= 0:
                    self.sim_faults_open -= 1
                else:
                    self.learner_down = False  # ... until the learner answered again


async def run_once(cfg: ChaosConfig, plan: list[Fault], label: str, work: Path, token: JobToken, log) -> dict:
    """One training run under `plan` (empty: no faults); returns its analysis."""
    ledger = Ledger()
    stack = Stack(cfg, token, work, ledger, log)
    injector = Injector(stack, plan, cfg, log)
    broker_code, timed_out, codes = None, False, {}
    started = time.monotonic()
    task = None
    try:
        await stack.start()
        log(f"{label}: stack up in {time.monotonic() - started:.1f} s; broker training {cfg.iterations} iterations")
        task = asyncio.create_task(injector.run())
        deadline = time.monotonic() + cfg.run_timeout_s
        while stack.broker.process.poll() is None and time.monotonic() < deadline:
            if task.done() and task.exception() is not None:
                raise task.exception()
            await asyncio.sleep(0.1)
        broker_code = stack.broker.process.poll()
        timed_out = broker_code is None
        t_end = time.monotonic()
    finally:
        injector.done.set()
        if task is not None:
            try:
                await asyncio.wait_for(task, 60)
            except Exception as exc:  # a fault that failed to inject; reported, the processes still stop
                log(f"{label}: fault injection failed: {type(exc).__name__}: {exc}")
        codes = await stack.shutdown()
    broker_lines = list(stack.broker.lines) if stack.broker else []
    learner_lines = [line for child in stack.launched if child.name == "learner" for line in child.lines]
    return analyse(cfg, label, ledger, stack, broker_code, timed_out, t_end, codes, broker_lines, learner_lines)

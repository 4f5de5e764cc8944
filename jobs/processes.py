"""Start FAST services as child processes, as a user would, and stop them for sure.

A service prints one line "... listening on HOST:PORT ..." once it serves. `launch` starts
`python -m fast <args>` and drains its output in a thread; `wait_listening` waits (bounded) for
that line; `start_service` does both. `stop` sends SIGTERM, waits, then SIGKILLs, so no test,
benchmark or `fast` job leaves a process behind while it lives.

And after it dies: every child gets FAST_PARENT_PID, and a service started with it stops
itself, gracefully, once that parent is gone (`fast.lifecycle.exit_with_parent`), even if the
parent was killed with SIGKILL and could stop nobody.

`launch(new_session=True)` puts the child in its own session. `fast train` wants that: a
terminal sends SIGINT to its whole foreground process group, and children in that group
would all stop at once (simulators vanishing under a broker mid-iteration, the learner
before evaluation); in their own sessions only `fast train` sees the signal and stops them
in the order it chooses.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from fast import auth
from fast.lifecycle import PARENT_ENV

_LISTENING = re.compile(r"listening on (\S+)")

log = logging.getLogger("jobs.processes")


@dataclass
class ServiceProcess:
    name: str
    process: subprocess.Popen
    address: str
    output: list[str] = field(default_factory=list)  # everything it printed

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, wait up to timeout_s, then SIGKILL; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout_s)
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL: a crash, for fault tests."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@dataclass
class Launch:
    """A child started but maybe not listening yet."""

    name: str
    command: list[str]
    env: dict[str, str]  # the variables set on top of the parent's environment
    process: subprocess.Popen
    lines: list[str] = field(default_factory=list)  # everything it printed
    found: list[str] = field(default_factory=list)  # its address, once printed
    ready: threading.Event = field(default_factory=threading.Event)  # set on the listening line or on exit

    def shell_line(self) -> str:
        """The command as a user would type it (for config.yaml and error messages)."""
        prefix = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return " ".join(prefix + [shlex.quote(part) for part in self.command])


class StartupError(RuntimeError):
    """A service exited or stayed silent before listening; the message holds its last lines."""


def launch(name: str, args: list[str], env: dict[str, str] | None = None, *, new_session: bool = False) -> Launch:
    """Run `python -m fast <args>`; drain its output in a thread for its whole life."""
    command = [sys.executable, "-m", "fast", *args]
    extra = dict(env or {})
    inherited = dict(os.environ)
    if extra.keys() & auth.TOKEN_VARIABLES:
        # The job gives the child a run token of its own: one the user exported must not override it.
        for variable in auth.TOKEN_VARIABLES:
            inherited.pop(variable, None)
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**inherited, "PYTHONUNBUFFERED": "1", PARENT_ENV: str(os.getpid()), **extra},
        start_new_session=new_session,
    )
    child = Launch(name, command, extra, process)

    def pump() -> None:
        # Drain the child's output for its whole life so it never blocks on a full pipe.
        assert process.stdout is not None
        for line in process.stdout:
            child.lines.append(line.rstrip("\n"))
            if not child.found:
                match = _LISTENING.search(line)
                if match:
                    child.found.append(match.group(1))
                    child.ready.set()
        child.ready.set()

    threading.Thread(target=pump, name=f"{name}-output", daemon=True).start()
    return child


def wait_listening(child: Launch, deadline: float, abort: Callable[[], bool] = lambda: False) -> ServiceProcess:
    """Block until `child` prints its listening line (or exits, the deadline passes, or abort() is true)."""
    while not child.ready.wait(timeout=0.05):
        if time.monotonic() > deadline or abort():
            break
    if not child.found:
        if abort():
            raise StartupError(f"start-up of {child.name} abandoned: a stop was asked for")
        code = child.process.poll()
        why = f"exited with code {code}" if code is not None else "did not print its listening line in time"
        tail = " | ".join(child.lines[-20:]) or "(no output)"
        raise StartupError(f"{child.name} {why} ({child.shell_line()}): {tail}")
    return ServiceProcess(child.name, child.process, child.found[0], child.lines)


def wait_for_line(
    child: Launch, pattern: re.Pattern[str], deadline: float, abort: Callable[[], bool] = lambda: False
) -> re.Match[str]:
    """Block until `child` prints a line matching `pattern` (before its listening line, e.g. learner rank 0's
    rendezvous address); StartupError if it exits first, the deadline passes or abort() is true."""
    seen = 0
    while True:
        lines = child.lines[seen:]
        seen += len(lines)
        for line in lines:
            match = pattern.search(line)
            if match:
                return match
        if child.process.poll() is not None or time.monotonic() > deadline or abort():
            tail = " | ".join(child.lines[-20:]) or "(no output)"
            raise StartupError(
                f"{child.name} printed no line matching {pattern.pattern!r} ({child.shell_line()}): {tail}"
            )
        time.sleep(0.05)


def stop(child: Launch, timeout_s: float) -> int | None:
    """SIGTERM, wait up to timeout_s, then SIGKILL; returns the exit code (None if it would not die)."""
    try:
        return ServiceProcess(child.name, child.process, "", child.lines).stop(timeout_s=timeout_s)
    except subprocess.TimeoutExpired:  # not even SIGKILL reaped it in time (a process in D state)
        return child.process.poll()


def start_service(
    name: str, args: list[str], *, timeout_s: float = 60.0, env: dict[str, str] | None = None
) -> ServiceProcess:
    """Run `python -m fast <args>` and wait for its listening line; StartupError (stopped) if it never comes."""
    child = launch(name, args, env)
    try:
        return wait_listening(child, time.monotonic() + timeout_s)
    except StartupError:
        stop(child, timeout_s=5)
        raise

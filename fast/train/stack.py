"""The local stack's processes: launched together, each in its own session, stopped in order.

`fast.processes.start_service` starts one service and waits for it; here several are launched
at once (simulators and learner import their libraries in parallel, which halves start-up on
a small machine) and each child gets its own session. That matters for Ctrl-C: a terminal
sends SIGINT to its whole foreground process group, and children in that group would all stop
at once (simulators vanishing under a broker mid-iteration, the learner before evaluation).
In their own sessions only `fast train` sees the signal and stops them in the order it chooses.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from fast.processes import _LISTENING, ServiceProcess


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
        """The command as a user would type it (for config.yaml)."""
        prefix = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return " ".join(prefix + [shlex.quote(part) for part in self.command])


def launch(name: str, args: list[str], env: dict[str, str] | None = None) -> Launch:
    """Run `python -m fast <args>` in a new session; drain its output in a thread."""
    command = [sys.executable, "-m", "fast", *args]
    extra = dict(env or {})
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **extra},
        start_new_session=True,
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


class StartupError(RuntimeError):
    """A service exited or stayed silent before listening; the message holds its last lines."""


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


def stop(child: Launch, timeout_s: float) -> int | None:
    """SIGTERM, wait up to timeout_s, then SIGKILL; returns the exit code (None if it would not die)."""
    try:
        return ServiceProcess(child.name, child.process, "", child.lines).stop(timeout_s=timeout_s)
    except subprocess.TimeoutExpired:  # not even SIGKILL reaped it in time (a process in D state)
        return child.process.poll()



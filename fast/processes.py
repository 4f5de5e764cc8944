"""Start FAST services as child processes, as a user would, and stop them for sure.

A service prints one line "... listening on HOST:PORT ..." once it serves; `start_service`
waits for that line (bounded) and returns the address. `stop` sends SIGTERM, waits, then
SIGKILLs, so no test, benchmark or `fast` job leaves a process behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

_LISTENING = re.compile(r"listening on (\S+)")


@dataclass
class ServiceProcess:
    name: str
    process: subprocess.Popen
    address: str
    output: list[str] = field(default_factory=list)  # lines printed after the ready line

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


def start_service(name: str, args: list[str], *, timeout_s: float = 60.0, env: dict[str, str] | None = None) -> ServiceProcess:
    """Run `python -m fast <args>` and wait for its listening line."""
    cmd = [sys.executable, "-m", "fast", *args]
    process = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    lines: list[str] = []
    found: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        # Drain the child's output for its whole life so it never blocks on a full pipe.
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            if not found:
                match = _LISTENING.search(line)
                if match:
                    found.append(match.group(1))
                    ready.set()
        ready.set()

    threading.Thread(target=pump, name=f"{name}-output", daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not ready.wait(timeout=0.05):
        if time.monotonic() > deadline:
            break
    if not found:
        service = ServiceProcess(name, process, "", lines)
        service.stop(timeout_s=5)
        raise RuntimeError(f"{name} did not start ({' '.join(cmd)}): " + " | ".join(lines[-20:]))
    return ServiceProcess(name, process, found[0], lines)

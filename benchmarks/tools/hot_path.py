"""Where a lock-step step's time goes: py-spy samples of a running process, sorted into kinds of work.

`Sampler` attaches py-spy (a sampling profiler from PyPI, no code in the profiled process) to a
pid without pausing it (`--nonblocking`) and with idle samples kept (`--idle`), so a thread
parked in the event loop's `select` counts as waiting rather than vanishing. `breakdown` reads
py-spy's raw output (one line per distinct stack: frames root to leaf, then a count) and gives,
for the process's main thread, the time spent in each kind of work (samples over the rate).

A sample's kind is decided from its innermost frame outwards, by the first frame a rule claims:
the event loop's selector is waiting; the policy runner is inference; tensor codecs, protobuf
and request/response building are serialisation; grpc is transport; asyncio is the event
loop's own scheduling (grpc's Cython callbacks, which py-spy cannot see, run under the loop's
`Handle._run` and count here too); the broker's modules are bookkeeping; the simulator's
environment and cost model are simulator work. So time in numpy under `PolicyRunner.act` is inference, and an
asyncio frame under a grpc call is transport's.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

KINDS = ("waiting", "simulator", "inference", "serialisation", "transport", "event loop", "bookkeeping", "other")

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")

# sim_server/client.py's functions that only build or decode messages.
_DECODING = ("step_reply", "reset_reply", "episode_summary")
# (kind, test on (function, file)), tried for each frame from the leaf outwards.
_RULES: tuple[tuple[str, Callable[[str, str], bool]], ...] = (
    ("waiting", lambda f, p: p.endswith("selectors.py") and f.endswith(("select", "poll"))),
    ("waiting", lambda f, p: p.endswith("precise_wait.py")),  # a server's emulated step latency
    ("inference", lambda f, p: p.endswith("broker/policy_runner.py")),
    ("simulator", lambda f, p: "sim_server/takeover/" in p or p.endswith(("sim_server/simulator.py", "cost_model.py"))),
    ("serialisation", lambda f, p: p.endswith("fast/tensor.py") or "google/protobuf" in p),
    ("serialisation", lambda f, p: p.endswith("sim_server/client.py") and f in _DECODING),
    # StepStream.step and the servicer's _step build the request / response messages themselves.
    ("serialisation", lambda f, p: p.endswith("sim_server/client.py") and f.endswith("step")),
    ("serialisation", lambda f, p: p.endswith("sim_server/servicer.py") and f.endswith("_step")),
    ("transport", lambda f, p: "grpc/" in p or p.startswith("src/python/grpcio")),
    ("event loop", lambda f, p: "asyncio/" in p),
    ("bookkeeping", lambda f, p: "/broker/" in p or p.startswith("broker/")),
)


def parse_frame(text: str) -> tuple[str, str]:
    """'func (path/file.py:12)' -> (func, path/file.py); a frame without a file -> (text, '')."""
    m = _FRAME.match(text.strip())
    return (m["func"], m["file"]) if m else (text.strip(), "")


def classify(frames: list[str]) -> str:
    """The kind of work of one stack (frames root to leaf, as py-spy writes them)."""
    for text in reversed(frames):
        func, path = parse_frame(text)
        for kind, claims in _RULES:
            if claims(func, path):
                return kind
    return "other"


def busy_seconds(raw: str, rate_hz: float, thread: str = "MainThread") -> dict[str, float]:
    """Seconds of each kind of work of the thread (samples / rate), from py-spy's raw output.

    `waiting` is left out: idle samples also fall before and after the window of interest (py-spy
    attaching, stopping), so the caller takes waiting as the window's wall time minus the busy
    kinds. Stacks under `settle` (this module's own pause while py-spy attaches) are skipped, as
    are other threads' (with `--threads` py-spy roots each stack at 'thread (TID): NAME')."""
    counts: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if not frames[0].startswith("thread (") or not frames[0].endswith(f": {thread}"):
            continue
        if any(parse_frame(f)[0] == "settle" for f in frames[1:]):
            continue
        counts[classify(frames[1:])] += int(count)
    return {kind: counts[kind] / rate_hz for kind in KINDS if kind != "waiting"}


def per_step_ms(raw: str, rate_hz: float, window_s: float, steps: int) -> dict[str, float]:
    """ms per step of each kind over a window of `window_s` wall seconds and `steps` steps; waiting is the rest."""
    busy = busy_seconds(raw, rate_hz)
    waiting = max(window_s - sum(busy.values()), 0.0)
    return {kind: (waiting if kind == "waiting" else busy[kind]) / steps * 1e3 for kind in KINDS}


def py_spy() -> str | None:
    """The py-spy executable beside this interpreter, or on PATH; None when not installed."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


class Sampler:
    """py-spy recording one process until `stop()`; `stop` returns the raw output (empty on failure)."""

    def __init__(self, pid: int, out: Path, *, rate_hz: int = 250) -> None:
        exe = py_spy()
        if exe is None:
            raise RuntimeError("py-spy is not installed: pip install py-spy (it is in the dev extras)")
        self.out, self.rate_hz = out, rate_hz
        self.proc = subprocess.Popen(
            [
                exe,
                "record",
                "--pid",
                str(pid),
                "--rate",
                str(rate_hz),
                "--nonblocking",
                "--idle",
                "--threads",
                "--format",
                "raw",
                "--output",
                str(out),
            ],  # fmt: skip
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.error = ""

    def stop(self, timeout_s: float = 20.0) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        try:
            _, err = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        self.error = (err or "").strip()[-500:]
        return self.out.read_text() if self.out.exists() else ""


def settle(seconds: float = 0.3) -> None:
    """py-spy needs a moment to attach before the work to profile starts."""
    time.sleep(seconds)


def can_attach() -> bool:
    """True when py-spy is installed and may read other processes' memory (root, or ptrace allowed)."""
    if py_spy() is None:
        return False
    try:
        return os.geteuid() == 0 or Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip() == "0"
    except OSError:
        return True

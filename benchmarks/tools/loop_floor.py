"""The closed-loop floor: how close to the ideal a lock-step loop can get on this machine at all.

The broker's overhead benchmark sets its throughput against an ideal, slots over the servers'
step latency, that no closed loop reaches: every step, each server must wake on its message,
compute, wait, write, and the driver must wake on the answers before the next actions exist.
On a virtual machine each sleep and wake costs CPU (an asyncio.sleep of 1 ms burned about
0.16 ms here), and the host may steal a share of the cores that the processes share.

This probe measures that floor side by side with the broker. It runs the least a closed loop
needs, as separate processes over Unix sockets (the local step socket's transport):
- k server processes that, per request, burn the environment's measured compute on the CPU
  (a spin, as numpy holds the core), then wait out the rest of the step latency with the
  simulator servers' own `precise_wait`, and answer with a payload the size of a real answer
  carrying the seconds they really took;
- a driver (this process) that writes to every server, waits for every answer, and repeats:
  no inference, no encoding, no checks, no bookkeeping.
Its throughput against the same ideal (slots over the latency the probe's servers really
measured) is the share a framework could reach here; the broker's share beside it shows how
much of the gap is the broker's own and how much is the machine's.

Run as a module (`python -m benchmarks.tools.loop_floor --socket PATH ...`, from the repository root) it is one
probe server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from fast.lifecycle import PARENT_ENV, exit_with_parent
from jobs.processes import ServiceProcess
from sim_server.precise_wait import precise_wait

_REQUEST = struct.Struct("<I")  # payload length, then the payload (the actions' bytes)
_ANSWER = struct.Struct("<Id")  # payload length, the seconds the server took; then the payload
_START_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class FloorResult:
    servers: int
    slots: int
    steps: int
    latency_s: float  # per step: the slowest server's own time (compute + wait), mean
    raw: float  # slot-steps a second
    # CPU per step (user + system, every thread): the driver (this process), all probe servers together.
    driver_cpu_s: float = math.nan
    servers_cpu_s: float = math.nan

    @property
    def ideal(self) -> float:
        return self.slots / self.latency_s

    @property
    def share(self) -> float:
        """The floor's throughput as a share of the ideal: the most a closed loop reaches here."""
        return self.raw / self.ideal


def check_costs(compute_s: float, latency_s: float) -> None:
    if latency_s <= 0:
        raise ValueError(f"latency_s must be positive, got {latency_s:g}")
    if not 0 <= compute_s <= latency_s:
        raise ValueError(f"compute_s must be between 0 and latency_s ({latency_s:g} s), got {compute_s:g}")


async def _serve_connection(reader, writer, compute_s: float, latency_s: float, answer: bytes) -> None:
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
        while True:
            (length,) = _REQUEST.unpack(await reader.readexactly(_REQUEST.size))
            await reader.readexactly(length)
            started = time.perf_counter()
            while time.perf_counter() - started < compute_s:  # the env's compute holds the core
                pass
            await precise_wait(latency_s - (time.perf_counter() - started))
            writer.write(_ANSWER.pack(len(answer), time.perf_counter() - started) + answer)
    writer.close()


async def serve(path: str, compute_s: float, latency_s: float, answer_bytes: int) -> None:
    """One probe server on the Unix socket `path`, until SIGTERM."""
    answer = bytes(answer_bytes)
    server = await asyncio.start_unix_server(
        lambda r, w: _serve_connection(r, w, compute_s, latency_s, answer), path=path
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        await stop.wait()


def _start(path: Path, compute_s: float, latency_s: float, answer_bytes: int) -> subprocess.Popen:
    """A probe server process on `path`; what it prints goes to `path`.log (read if it fails to start)."""
    command = [sys.executable, "-m", "benchmarks.tools.loop_floor", "--socket", str(path)]
    command += ["--compute-s", repr(compute_s), "--latency-s", repr(latency_s), "--answer-bytes", str(answer_bytes)]
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, PARENT_ENV: str(os.getpid()), "PYTHONPATH": root}
    with open(path.with_suffix(".log"), "wb") as log:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)


async def _connect(path: Path, process: subprocess.Popen) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the probe server on `path`, once it listens. The socket file appears at bind(),
    a moment before listen(): a connection in between is refused, so a refusal is retried too."""
    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        try:
            return await asyncio.open_unix_connection(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            pass
        if process.poll() is not None:
            error = path.with_suffix(".log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"a loop-floor server exited with code {process.returncode}: {error}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"a loop-floor server did not listen on {path} within {_START_TIMEOUT_S:g} s")
        await asyncio.sleep(0.01)


class LoopFloor:
    """Probe servers for a lock-step loop over len(slots_per_server) of them, started on entry and
    stopped on exit; `run(steps)` measures, as often as asked (interleaved with other measurements)."""

    def __init__(
        self,
        slots_per_server: list[int],
        *,
        compute_s: float,
        latency_s: float,
        request_bytes: int,
        answer_bytes_per_slot: int,
    ) -> None:
        check_costs(compute_s, latency_s)
        if not slots_per_server or min(slots_per_server) < 1:
            raise ValueError(f"slots_per_server needs at least one server of at least one slot, got {slots_per_server}")
        if request_bytes < 0 or answer_bytes_per_slot < 0:
            raise ValueError("request_bytes and answer_bytes_per_slot must not be negative")
        self.slots_per_server = list(slots_per_server)
        self.compute_s, self.latency_s = compute_s, latency_s
        self.answer_bytes_per_slot = answer_bytes_per_slot
        self._request = _REQUEST.pack(request_bytes) + bytes(request_bytes)
        self._where: Path | None = None
        self._processes: list[subprocess.Popen] = []
        self._streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def __aenter__(self) -> LoopFloor:
        self._where = Path(tempfile.mkdtemp(prefix="fast-floor-"))  # short: a Unix socket path has at most 107 bytes
        try:
            for i, k in enumerate(self.slots_per_server):
                path = self._where / f"{i}.sock"
                self._processes.append(_start(path, self.compute_s, self.latency_s, k * self.answer_bytes_per_slot))
            for i, process in enumerate(self._processes):
                self._streams.append(await _connect(self._where / f"{i}.sock", process))
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc_info) -> None:
        for _, writer in self._streams:
            writer.close()
        for process in self._processes:
            ServiceProcess("loop-floor", process, "").stop(timeout_s=5)  # SIGTERM, then SIGKILL
        if self._where is not None:
            shutil.rmtree(self._where, ignore_errors=True)
        self._streams, self._processes, self._where = [], [], None

    async def _step(self) -> float:
        """One lock-step step: the request to every server, then every answer; the slowest server's own time."""

        async def answer(reader: asyncio.StreamReader) -> float:
            length, took_s = _ANSWER.unpack(await reader.readexactly(_ANSWER.size))
            await reader.readexactly(length)
            return took_s

        for _, writer in self._streams:
            writer.write(self._request)
        return max(await asyncio.gather(*(answer(reader) for reader, _ in self._streams)))

    async def run(self, steps: int, *, warmup_steps: int = 20) -> FloorResult:
        """`steps` lock-step steps after `warmup_steps`, timed."""
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        if not self._streams:
            raise RuntimeError("LoopFloor.run outside `async with`")
        for _ in range(warmup_steps):
            await self._step()
        server_s = []
        pids = [p.pid for p in self._processes]
        cpu_before, servers_before = time.process_time(), processes_cpu_s(pids)
        started = time.perf_counter()
        for _ in range(steps):
            server_s.append(await self._step())
        wall = time.perf_counter() - started
        slots = sum(self.slots_per_server)
        return FloorResult(
            servers=len(self.slots_per_server),
            slots=slots,
            steps=steps,
            latency_s=statistics.fmean(server_s),
            raw=slots * steps / wall,
            driver_cpu_s=(time.process_time() - cpu_before) / steps,
            servers_cpu_s=(processes_cpu_s(pids) - servers_before) / steps,
        )


def processes_cpu_s(pids: list[int]) -> float:
    """The CPU seconds (user + system, all threads) the processes have used so far, together; NaN
    where /proc cannot tell (not Linux, or one of them is gone)."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()  # after the name, which may hold spaces
        except OSError:
            return math.nan
        total += (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime
    return total


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="one loop-floor probe server (benchmarks/tools/loop_floor.py)")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--compute-s", type=float, required=True)
    parser.add_argument("--latency-s", type=float, required=True)
    parser.add_argument("--answer-bytes", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        check_costs(args.compute_s, args.latency_s)
    except ValueError as exc:
        parser.error(str(exc))
    exit_with_parent()
    asyncio.run(serve(args.socket, args.compute_s, args.latency_s, args.answer_bytes))


if __name__ == "__main__":
    main()

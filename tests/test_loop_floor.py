"""The closed-loop floor probe (benchmarks/tools/loop_floor.py): real probe server processes over Unix sockets."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.tools.loop_floor import LoopFloor

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(60)
def test_the_floor_steps_every_server_in_lock_step_and_cleans_up() -> None:
    async def go():
        floor = LoopFloor([2, 3], compute_s=0.0002, latency_s=0.002, request_bytes=40, answer_bytes_per_slot=100)
        async with floor:
            where = floor._where
            processes = list(floor._processes)
            first = await floor.run(30, warmup_steps=2)
            second = await floor.run(10, warmup_steps=0)  # runs again on the same servers
        return first, second, where, processes

    first, second, where, processes = asyncio.run(go())
    assert (first.servers, first.slots, first.steps, second.steps) == (2, 5, 30, 10)
    # Every step waits for the slower server, whose own time is the latency it emulates.
    assert 0.0018 <= first.latency_s < 0.05
    # A closed loop never beats slots / latency (a little slack for the servers' own clock).
    assert 0 < first.share <= 1.05 and 0 < second.share <= 1.05
    # CPU per step: the driver's own (a clock of this process), the servers' from /proc (10 ms ticks).
    assert 0 < first.driver_cpu_s < first.latency_s * 5 and first.servers_cpu_s >= 0
    assert all(p.poll() is not None for p in processes)  # every probe server stopped
    assert where is not None and not where.exists()  # its sockets' directory removed


def test_the_floor_refuses_costs_and_shapes_that_make_no_sense() -> None:
    with pytest.raises(ValueError, match="compute_s must be between 0 and latency_s"):
        LoopFloor([1], compute_s=0.003, latency_s=0.002, request_bytes=1, answer_bytes_per_slot=1)
    with pytest.raises(ValueError, match="latency_s must be positive"):
        LoopFloor([1], compute_s=0.0, latency_s=0.0, request_bytes=1, answer_bytes_per_slot=1)
    with pytest.raises(ValueError, match="slots_per_server"):
        LoopFloor([2, 0], compute_s=0.0, latency_s=0.001, request_bytes=1, answer_bytes_per_slot=1)
    with pytest.raises(ValueError, match="must not be negative"):
        LoopFloor([1], compute_s=0.0, latency_s=0.001, request_bytes=-1, answer_bytes_per_slot=1)
    floor = LoopFloor([1], compute_s=0.0, latency_s=0.001, request_bytes=1, answer_bytes_per_slot=1)
    with pytest.raises(RuntimeError, match="outside `async with`"):
        asyncio.run(floor.run(5))


def test_a_probe_server_refuses_bad_costs_naming_the_flag(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.tools.loop_floor", "--socket", str(tmp_path / "s.sock")]
        + ["--compute-s", "0.01", "--latency-s", "0.002", "--answer-bytes", "8"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "compute_s must be between 0 and latency_s" in done.stderr
    assert not (tmp_path / "s.sock").exists()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_broker_overhead_reports_the_floor_beside_the_broker(tmp_path: Path) -> None:
    """The benchmark as a user runs it (smallest settings): every row carries the floor measured beside it."""
    done = subprocess.run(
        [sys.executable, "benchmarks/broker_overhead.py", "--iterations", "1", "--samples", "200"]
        + ["--servers", "1", "--pipeline", "off", "--transport", "local", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = json.loads((tmp_path / "overhead.json").read_text())["results"]
    assert [(r["slots"], r["servers"]) for r in results] == [(10, 1), (30, 1)]
    for r in results:
        floor = r["floor"]
        assert 0 < floor["share"] <= 1.05 and floor["raw"] > 0
        assert 0 < floor["compute_ms"] <= 1.6  # the servers' reported compute, capped at the step latency
        assert r["broker_cpu_ms"] > 0 and floor["driver_cpu_ms"] > 0
        assert r["servers_cpu_ms"] >= 0 and floor["servers_cpu_ms"] >= 0  # /proc counts whole 10 ms ticks
        bare = r["bare"]  # the same servers, stepped by a loop that does nothing else
        assert 0 < bare["share"] <= 1.05 and bare["raw"] > 0 and bare["latency_ms"] >= 1.5
    report = (tmp_path / "overhead.txt").read_text()
    assert "raw/floor" in report and "closed-loop floor" in report and "CPU per lock-step step" in report
    assert "raw/bare" in report and "bare driver" in report

"""`fast sim-check`: the built-in servers conform, a sloppy one is caught row by row with its fix."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import sim_server
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fast import auth, tensor
from fast.rpc import Credentials
from fast.spaces import SpaceSpec, space_to_proto
from fast.v1 import simulator_pb2 as pb
from fast.v1 import simulator_pb2_grpc as pb_grpc
from jobs.sim_check import Options, UsageError, run_checks
from jobs.sim_check.target import step_verdicts
from sim_server.client import StepReply


def sim_check(address: str, json_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    done = subprocess.run(
        [sys.executable, "-m", "fast", "sim-check", address, "--json", str(json_path), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(json_path.read_text()) if json_path.exists() else {}
    return done, report


def rows(report: dict, status: str) -> list[dict]:
    return [r for r in report["results"] if r["status"] == status]


def assert_conforms(done: subprocess.CompletedProcess, report: dict) -> None:
    assert done.returncode == 0, done.stdout + done.stderr
    assert not rows(report, "fail") and not rows(report, "warn"), done.stdout
    assert {r["status"] for r in report["results"]} <= {"pass", "skip"}
    summary = report["summary"]
    assert f"{summary['passed']} passed, 0 failed, {summary['skipped']} skipped" in done.stdout
    figures = {f["name"]: f for f in report["figures"]}
    assert {"Reset, 1 slot", "Step, 1 slot"} <= figures.keys()
    assert all(f["calls"] >= 3 and f["median_ms"] > 0 and f["p95_ms"] >= f["median_ms"] for f in figures.values())


@pytest.mark.slow
def test_takeover_server_conforms_and_drains_on_sigterm(tmp_path: Path) -> None:
    with sim_server("--env", "takeover", "--slots", "4", "--cost-preset", "off") as server:
        done, report = sim_check(server.address, tmp_path / "takeover.json", "--pid", str(server.pid))
        assert server.process.wait(timeout=30) == 0  # sim-check's SIGTERM: drained and exited 0
    assert_conforms(done, report)
    assert report["env_id"] == "takeover" and report["exit_code"] == 0
    passed = {r["name"] for r in rows(report, "pass")}
    assert {
        "SIGTERM: the call in flight completes",
        "SIGTERM: new calls are refused",
        "SIGTERM: the process exits",
        "Step: a slot never reset -> FAILED_PRECONDITION",  # a fresh server
        "Step of an ended slot without Reset -> FAILED_PRECONDITION",
        "StepStream: one answer per request, in order, request_id echoed",
        "refused calls leave the slot as it was",
        "Prepare: a Reset onto the prepared clip starts the same episode as without Prepare",
        "Prepare: a Reset onto another clip is served as a plain Reset",
        "Prepare of a clip that does not exist: NOT_FOUND",
        "local step socket: answers as Step does",
        "local step socket: a connection without the run token -> UNAUTHENTICATED",
    } <= passed
    assert not rows(report, "skip"), rows(report, "skip")


@pytest.mark.slow
def test_gym_server_conforms_and_a_wrong_token_is_a_usage_error(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong-token"
    auth.write_token_file(wrong)
    with sim_server("--env", "gym:CartPole-v1", "--slots", "2") as server:
        refused, _ = sim_check(server.address, tmp_path / "refused.json", "--token-file", str(wrong))
        done, report = sim_check(server.address, tmp_path / "gym.json")
    assert refused.returncode == 2 and "refused the run token" in refused.stderr and "--token-file" in refused.stderr
    assert not (tmp_path / "refused.json").exists()
    assert_conforms(done, report)
    skipped = {r["name"]: r["detail"] for r in rows(report, "skip")}
    assert skipped["Step: a NaN action -> INVALID_ARGUMENT"] == "skipped: the action space is Discrete(2)"
    assert skipped["SIGTERM: the process exits"] == "skipped: give --pid to check"


# -- a server that breaks the contract --------------------------------------------------------------------

OBS = SpaceSpec("box", (3,), np.dtype(np.float32), np.full(3, -1, np.float32), np.full(3, 1, np.float32))
ACT = SpaceSpec("box", (1,), np.dtype(np.float32), np.full(1, -1, np.float32), np.full(1, 1, np.float32))


class SloppySimulator(pb_grpc.SimulatorServicer):
    """Speaks fast.v1 but answers NaN rewards, sets terminated and truncated together, and validates nothing
    (OK to an unknown slot id)."""

    def Describe(self, request, context):
        return pb.DescribeResponse(
            env_id="sloppy",
            observation_space=space_to_proto(OBS),
            action_space=space_to_proto(ACT),
            num_slots=2,
            num_clips=5,
            api_version="fast.v1",
        )

    def Reset(self, request, context):
        k = len(request.slot_ids)
        return pb.ResetResponse(slot_ids=request.slot_ids, observations=tensor.to_proto(np.zeros((k, 3), np.float32)))

    def Step(self, request, context):
        k = len(request.slot_ids)
        return pb.StepResponse(
            slot_ids=request.slot_ids,
            observations=tensor.to_proto(np.zeros((k, 3), np.float32)),
            rewards=tensor.to_proto(np.full(k, np.nan, np.float32)),
            terminated=tensor.to_proto(np.ones(k, bool)),
            truncated=tensor.to_proto(np.ones(k, bool)),
            episodes=[pb.EpisodeSummary(slot_id=s, length=1, terminated=True) for s in request.slot_ids],
            request_id=request.request_id,
        )


@pytest.mark.slow
def test_a_server_without_stream_or_batched_reset_conforms(tmp_path: Path) -> None:
    # Both capabilities are optional: sim-check sends such a server what the broker sends it.
    with sim_server(
        "--slots", "3", "--cost-preset", "off", "--no-step-stream", "--no-batched-reset", "--no-prefetch"
    ) as server:
        done, report = sim_check(server.address, tmp_path / "bare.json")
    assert_conforms(done, report)
    assert any("not advertised" in r.get("detail", "") for r in rows(report, "skip"))


def test_sloppy_server_fails_with_a_fix_for_each_breach(tmp_path: Path) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_SimulatorServicer_to_server(SloppySimulator(), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", "fast.v1.Simulator"):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        done, report = sim_check(f"127.0.0.1:{port}", tmp_path / "sloppy.json", "--steps", "20")
    finally:
        server.stop(grace=None)
    assert done.returncode == 1, done.stdout + done.stderr
    failed = {r["name"]: r for r in rows(report, "fail")}
    rewards = failed["answers: rewards float [k], finite"]
    assert "rewards must be finite" in rewards["detail"] and "finite values (no NaN or inf)" in rewards["fix"]
    flags = failed["answers: terminated and truncated bool [k], never both true"]
    assert "both terminated and truncated" in flags["detail"] and "never both true" in flags["fix"]
    unknown = failed["Reset: slot id = num_slots -> NOT_FOUND"]
    assert unknown["detail"] == "answered OK, expected NOT_FOUND"
    assert unknown["fix"] == "answer NOT_FOUND for a slot id outside 0..num_slots-1, as docs/simulator_api.md says"
    assert "Step: slot id = num_slots -> NOT_FOUND" in failed
    assert "Step of an ended slot without Reset -> FAILED_PRECONDITION" in failed
    # What it does keep is not blamed.
    passed = {r["name"] for r in rows(report, "pass")}
    assert {"observation_space usable", "answers: slot_ids are those asked, in order"} <= passed
    skipped = {r["name"] for r in rows(report, "skip")}
    assert "StepStream: one answer per request, in order, request_id echoed" in skipped
    summary = report["summary"]
    assert f"{summary['passed']} passed, {summary['failed']} failed, {summary['skipped']} skipped" in done.stdout
    assert "FAIL" in done.stdout and "fix:" in done.stdout


# -- pieces, without a server --------------------------------------------------------------------------------


def test_step_verdicts_name_every_field_the_broker_refuses() -> None:
    k = 2
    reply = StepReply(
        slot_ids=np.array([0, 1]),
        observations=np.zeros((k, 3), np.float32),
        rewards=np.array([np.nan, 0], np.float32),
        terminated=np.array([True, False]),
        truncated=np.array([True, False]),
        episodes=[],
        timing=pb.ServerTiming(compute_s=-1.0),
    )
    verdicts = step_verdicts(reply, np.array([0, 1]), OBS)
    assert list(verdicts) == ["rewards", "flags", "episodes", "timing"]
    assert "no summary for slot 0" in verdicts["episodes"]


def test_unreachable_address_is_a_usage_error() -> None:
    options = Options(connect_timeout_s=0.5)
    with pytest.raises(UsageError, match="cannot reach 127.0.0.1:1: nothing accepted a connection"):
        asyncio.run(run_checks("127.0.0.1:1", Credentials("token"), options))

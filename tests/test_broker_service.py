"""The broker's control API over real gRPC, with the services as processes: DNS discovery,
registering a simulator at run time, pause / resume / stop, and the errors."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import grpc
import pytest

from fast.addresses import resolve_addresses
from fast.rpc import open_blocking_channel
from fast.v1 import broker_pb2 as pb
from fast.v1 import broker_pb2_grpc as pb_grpc
from jobs.processes import start_service


def test_resolve_addresses_dns_and_plain() -> None:
    assert resolve_addresses("10.1.2.3:50051") == ["10.1.2.3:50051"]
    assert resolve_addresses("dns:///localhost:7000") == ["127.0.0.1:7000"]  # one server, not one per family
    with pytest.raises(ValueError, match="expected dns:///NAME:PORT"):
        resolve_addresses("dns:///localhost")


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_register_pause_resume_stop(tmp_path) -> None:
    a = start_service("sim-a", ["sim-server", "--slots", "2", "--port", "0"])
    b = start_service("sim-b", ["sim-server", "--slots", "3", "--port", "0"])
    cartpole = start_service("sim-c", ["sim-server", "--env", "gym:CartPole-v1", "--slots", "1", "--port", "0"])
    learner = start_service(
        "learner",
        [
            "learner",
            "--port",
            "0",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            "--update-epochs",
            "1",
            "--num-minibatches",
            "1",
        ],
    )
    port_a = a.address.rsplit(":", 1)[1]
    broker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fast",
            "broker",
            "--simulators",
            f"dns:///localhost:{port_a}",
            "--learner",
            learner.address,
            "--mode",
            "fast",
            "--iterations",
            "0",
            "--samples-per-iteration",
            "64",
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = _wait(lambda: broker.stdout.readline(), 60, "the broker's listening line")
        address = re.search(r"listening on (\S+)", line).group(1)
        with open_blocking_channel(address) as channel:
            stub = pb_grpc.BrokerStub(channel)
            status = lambda: stub.GetRunStatus(pb.GetRunStatusRequest(), timeout=5)  # noqa: E731
            _wait(lambda: status().iteration >= 1, 60, "a first iteration")
            assert [s.address for s in status().simulators] == [f"127.0.0.1:{port_a}"]

            reply = stub.RegisterSimulator(pb.RegisterSimulatorRequest(address=b.address), timeout=10)
            assert reply.num_slots == 3 and reply.env_id == "takeover"
            _wait(lambda: len(status().simulators) == 2, 60, "the registered simulator to join")
            assert sum(s.num_slots for s in status().simulators) == 5 and all(s.up for s in status().simulators)

            for request, code, fragment in [
                (pb.RegisterSimulatorRequest(address=""), grpc.StatusCode.INVALID_ARGUMENT, "address is empty"),
                (pb.RegisterSimulatorRequest(address="127.0.0.1:1"), grpc.StatusCode.UNAVAILABLE, "did not answer"),
                (
                    pb.RegisterSimulatorRequest(address=cartpole.address),
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "does not match the pool",
                ),
            ]:
                with pytest.raises(grpc.RpcError) as excinfo:
                    stub.RegisterSimulator(request, timeout=10)
                assert excinfo.value.code() == code and fragment in excinfo.value.details()
            with pytest.raises(grpc.RpcError) as excinfo:
                stub.Control(pb.ControlRequest(), timeout=5)
            assert excinfo.value.code() == grpc.StatusCode.INVALID_ARGUMENT

            assert stub.Control(pb.ControlRequest(action=pb.CONTROL_ACTION_PAUSE), timeout=5).state in (
                pb.RUN_STATE_PAUSING,
                pb.RUN_STATE_PAUSED,
            )
            paused_at = _wait(
                lambda: status().iteration if status().state == pb.RUN_STATE_PAUSED else None, 30, "pause"
            )
            time.sleep(0.5)
            assert status().iteration == paused_at  # PAUSED: the iteration in flight was the last one
            stub.Control(pb.ControlRequest(action=pb.CONTROL_ACTION_RESUME), timeout=5)
            resumed_from = status().iteration
            _wait(lambda: status().iteration > resumed_from, 60, "iterations after resume")
            stub.Control(pb.ControlRequest(action=pb.CONTROL_ACTION_STOP), timeout=5)
        assert broker.wait(timeout=60) == 0
    finally:
        if broker.poll() is None:
            broker.kill()
            broker.wait()
        for service in (a, b, cartpole, learner):
            service.stop()

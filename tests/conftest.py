"""Shared fixtures: services started as a user starts them (`python -m fast ...`), on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest

from jobs.processes import ServiceProcess, start_service
from fast.v1 import simulator_pb2_grpc as pb_grpc


@contextmanager
def sim_server(*args: str) -> Iterator[ServiceProcess]:
    """A `fast sim-server` process on 127.0.0.1:<free port>, stopped on exit."""
    service = start_service("sim-server", ["sim-server", "--host", "127.0.0.1", "--port", "0", *args])
    try:
        yield service
    finally:
        service.stop()


@contextmanager
def stub_for(address: str, stub_class=pb_grpc.SimulatorStub):
    """A synchronous stub of `stub_class` on a ready channel to `address`, closed on exit."""
    channel = grpc.insecure_channel(address)
    try:
        grpc.channel_ready_future(channel).result(timeout=10)
        yield stub_class(channel)
    finally:
        channel.close()


@pytest.fixture(scope="module")
def takeover_server() -> Iterator[ServiceProcess]:
    with sim_server("--env", "takeover", "--slots", "8") as service:
        yield service


@pytest.fixture()
def takeover_stub(takeover_server: ServiceProcess) -> Iterator[pb_grpc.SimulatorStub]:
    with stub_for(takeover_server.address) as stub:
        yield stub

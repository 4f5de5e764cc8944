"""Shared fixtures and checks: services started as a user starts them (`python -m fast ...`), on loopback.

Before anything starts, the session gets a run token of its own (FAST_AUTH_TOKEN_FILE, in a temp
directory that is also FAST_HOME): every service and client of the tests uses it, and no test
reads or writes the user's ~/.fast.

Every process of the session computes with one thread (OMP_NUM_THREADS=1 unless set): torch's
intra-op threads only spin on these tiny models, and under parallel workers (`dev.py test` runs 4;
tests/xdist_units.py says how they share the suite) they halve what the suite gets done per core.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from xdist_units import pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: F401 (hooks)

from fast import auth
from fast.rpc import open_blocking_channel
from fast.v1 import simulator_pb2_grpc as pb_grpc
from jobs.processes import ServiceProcess, start_service


def _session_token() -> Path:
    home = Path(tempfile.mkdtemp(prefix="fast-test-auth-"))  # mode 0700
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    path = home / "session-token"
    auth.write_token_file(path)
    for name in auth.TOKEN_VARIABLES:
        os.environ.pop(name, None)  # a token the user exported must not mix in
    os.environ[auth.HOME_ENV] = str(home / "home")
    os.environ[auth.TOKEN_FILE_ENV] = str(path)
    return path


SESSION_TOKEN_FILE = _session_token()
os.environ.setdefault("OMP_NUM_THREADS", "1")


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
    """A synchronous stub of `stub_class` on a ready channel to `address` (the session's token on
    every call), closed on exit."""
    channel = open_blocking_channel(address)
    try:
        grpc.channel_ready_future(channel).result(timeout=10)
        yield stub_class(channel)
    finally:
        channel.close()


def assert_serving_with_reflection(address: str, service: str) -> None:
    """What container health checks and grpcurl rely on: the standard health service answers
    SERVING for the whole server ("") and for `service`, and reflection lists both."""
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", service):
            r = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
            assert r.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (answer,) = list(reflection.ServerReflectionInfo(iter([request]), timeout=10))
        assert {service, "grpc.health.v1.Health"} <= {s.name for s in answer.list_services_response.service}


@pytest.fixture(scope="module")
def takeover_server() -> Iterator[ServiceProcess]:
    with sim_server("--env", "takeover", "--slots", "8") as service:
        yield service


@pytest.fixture()
def takeover_stub(takeover_server: ServiceProcess) -> Iterator[pb_grpc.SimulatorStub]:
    with stub_for(takeover_server.address) as stub:
        yield stub


class Aborted(Exception):
    """What FakeContext.abort raises: the status code and details a servicer answered with."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class FakeContext:
    """The one grpc.aio context method servicers call on refusal, for tests without sockets."""

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)

"""Authentication and TLS: the run token on every call (fast/auth.py), optional TLS and mutual TLS
(fast/tls.py), with real service processes on loopback and `fast train` end to end."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import SESSION_TOKEN_FILE
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.pool import SimulatorPool
from fast import auth
from fast.rpc import Credentials, is_loopback, start_server
from fast.tls import TlsFiles
from fast.v1 import broker_pb2, broker_pb2_grpc, learner_pb2, learner_pb2_grpc
from fast.v1 import simulator_pb2 as sim_pb2
from fast.v1 import simulator_pb2_grpc as sim_pb2_grpc
from jobs.processes import ServiceProcess, StartupError, start_service
from sim_server.client import SimulatorClient
from sim_server.config import SimServerConfig
from sim_server.server import build_simulator, create_server

TOKEN = SESSION_TOKEN_FILE.read_text().strip()
WRONG = "not-the-run-token-" + "x" * 20


# -- where the token comes from -------------------------------------------------------------------


def _private_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_token_from_the_variable_or_the_file(tmp_path: Path) -> None:
    assert auth.run_token({auth.TOKEN_ENV: "  abc-123\n"}) == "abc-123"
    path = _private_file(tmp_path / "token", "\n  from-a-file  \n\n")
    assert auth.run_token({auth.TOKEN_FILE_ENV: str(path)}) == "from-a-file"
    with pytest.raises(auth.AuthError, match="set only one"):
        auth.run_token({auth.TOKEN_ENV: "a", auth.TOKEN_FILE_ENV: str(path)})
    with pytest.raises(auth.AuthError, match="empty token"):
        auth.run_token({auth.TOKEN_ENV: "  "})
    with pytest.raises(auth.AuthError, match="empty token"):
        auth.run_token({auth.TOKEN_FILE_ENV: str(_private_file(tmp_path / "blank", " \n"))})
    with pytest.raises(auth.AuthError, match="does not exist"):
        auth.run_token({auth.TOKEN_FILE_ENV: str(tmp_path / "missing")})
    with pytest.raises(auth.AuthError, match="header cannot carry"):
        auth.run_token({auth.TOKEN_ENV: "two words"})


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o622])
def test_a_token_file_open_to_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = _private_file(tmp_path / "token", "secret-value", mode)
    with pytest.raises(auth.AuthError) as refused:
        auth.run_token({auth.TOKEN_FILE_ENV: str(path)})
    message = str(refused.value)
    assert str(path) in message and f"chmod 600 {path}" in message and "secret-value" not in message
    path.chmod(0o400)
    assert auth.run_token({auth.TOKEN_FILE_ENV: str(path)}) == "secret-value"


def test_the_default_token_file_is_created_private_and_reused(tmp_path: Path) -> None:
    home = tmp_path / "fast-home"
    environ = {auth.HOME_ENV: str(home)}
    first = auth.run_token(environ)
    path = home / "token"
    assert path.read_text().strip() == first and len(first) >= 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(home.stat().st_mode) == 0o700
    assert auth.run_token(environ) == first
    assert [p.name for p in home.iterdir()] == ["token"]  # no draft left behind


def test_processes_racing_to_create_the_default_file_agree(tmp_path: Path) -> None:
    home = tmp_path / "raced"
    script = "from fast import auth; print(auth.run_token())"
    env = {k: v for k, v in os.environ.items() if k not in auth.TOKEN_VARIABLES} | {auth.HOME_ENV: str(home)}
    racers = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env) for _ in range(6)
    ]
    tokens = {racer.communicate(timeout=60)[0].strip() for racer in racers}
    assert all(racer.returncode == 0 for racer in racers)
    assert tokens == {(home / "token").read_text().strip()}
    assert [p.name for p in home.iterdir()] == ["token"]


def test_a_service_with_a_world_readable_token_file_does_not_start(tmp_path: Path) -> None:
    path = _private_file(tmp_path / "token", "secret-value", 0o644)
    with pytest.raises(StartupError) as failed:
        start_service("sim-server", ["sim-server", "--port", "0"], env={auth.TOKEN_FILE_ENV: str(path)}, timeout_s=60)
    assert f"chmod 600 {path}" in str(failed.value) and "secret-value" not in str(failed.value)


def test_refusals_are_logged_without_the_token_and_rate_limited(caplog) -> None:
    refusals = auth._RefusalLog(every_s=3600)
    with caplog.at_level(logging.WARNING, logger="fast.auth"):
        for _ in range(1000):
            refusals.note("/fast.v1.Simulator/Reset", "ipv4:10.0.0.9:5555", "wrong run token")
    assert len(caplog.records) == 1
    assert "/fast.v1.Simulator/Reset" in caplog.text and "10.0.0.9" in caplog.text
    refusals._quiet_until = 0.0
    with caplog.at_level(logging.WARNING, logger="fast.auth"):
        refusals.note("/fast.v1.Simulator/Reset", "ipv4:10.0.0.9:5555", "no run token")
    assert "999 wrong run token" in caplog.records[-1].getMessage()


def test_binding_beyond_loopback_without_tls_warns(caplog) -> None:
    assert is_loopback("127.0.0.1:0") and is_loopback("[::1]:50051") and is_loopback("localhost:1")
    assert not any(is_loopback(a) for a in ("0.0.0.0:1", ":::1", "[::]:1", "10.1.2.3:1", "sim-server:50051"))

    async def serve(address: str) -> None:
        server, _, _ = await start_server(address, "test.Nothing", lambda server: None, token="t0ken")
        await server.stop(None)

    with caplog.at_level(logging.WARNING, logger="fast.rpc"):
        asyncio.run(serve("127.0.0.1:0"))
        assert not caplog.records
        asyncio.run(serve("0.0.0.0:0"))
    assert "without TLS" in caplog.text and "0.0.0.0:0" in caplog.text


# -- every service refuses a call without the token -----------------------------------------------


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[dict[str, ServiceProcess]]:
    """A simulator server, a learner and a broker (paused at once), all with the session's token."""
    started: dict[str, ServiceProcess] = {}
    try:
        started["simulator"] = start_service("sim", ["sim-server", "--slots", "2", "--port", "0"])
        checkpoints = tmp_path_factory.mktemp("auth-ckpt")
        started["learner"] = start_service(
            "learner", ["learner", "--port", "0", "--checkpoint-dir", str(checkpoints), "--update-epochs", "1"]
        )
        started["broker"] = start_service(
            "broker",
            [
                "broker",
                "--simulators",
                started["simulator"].address,
                "--learner",
                started["learner"].address,
                "--samples-per-iteration",
                "32",
                "--port",
                "0",
            ],
        )
        yield started
    finally:
        for service in reversed(started.values()):
            service.stop()


# One mutating call of each service, and the stub that makes it.
MUTATING = {
    "simulator": (sim_pb2_grpc.SimulatorStub, "Reset", sim_pb2.ResetRequest(slot_ids=[0], clip_ids=[1])),
    "learner": (learner_pb2_grpc.LearnerStub, "SubmitBatch", learner_pb2.SubmitBatchRequest()),
    "broker": (
        broker_pb2_grpc.BrokerStub,
        "Control",
        broker_pb2.ControlRequest(action=broker_pb2.CONTROL_ACTION_PAUSE),
    ),
}


@pytest.mark.parametrize("service", sorted(MUTATING))
def test_a_call_without_the_right_token_is_unauthenticated(stack, service: str) -> None:
    stub_class, method, request = MUTATING[service]
    address = stack[service].address
    with grpc.insecure_channel(address) as channel:
        call = getattr(stub_class(channel), method)
        for metadata in (None, [("authorization", f"Bearer {WRONG}")], [("authorization", TOKEN)]):
            with pytest.raises(grpc.RpcError) as refused:
                call(request, timeout=10, metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            details = refused.value.details()
            assert TOKEN not in details and WRONG not in details
            assert "FAST_AUTH_TOKEN" in details and "authorization: Bearer" in details
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    # The service logs the refusal on its stderr, which a thread of ours reads: wait for the line.
    deadline = time.monotonic() + 15
    while not (refusals := [line for line in stack[service].output if "refused" in line]):
        assert time.monotonic() < deadline, f"{service} logged no refusal: {stack[service].output[-5:]}"
        time.sleep(0.05)
    assert f"/{method}" in refusals[0]
    assert not any(TOKEN in line or WRONG in line for line in stack[service].output)


def test_the_right_token_is_answered(stack) -> None:
    bearer = [("authorization", f"Bearer {TOKEN}")]
    with grpc.insecure_channel(stack["broker"].address) as channel:
        reply = broker_pb2_grpc.BrokerStub(channel).Control(
            broker_pb2.ControlRequest(action=broker_pb2.CONTROL_ACTION_PAUSE), timeout=10, metadata=bearer
        )
        assert reply.state in (broker_pb2.RUN_STATE_PAUSED, broker_pb2.RUN_STATE_STARTING)
    with grpc.insecure_channel(stack["learner"].address) as channel:
        status = learner_pb2_grpc.LearnerStub(channel).GetStatus(
            learner_pb2.GetStatusRequest(), timeout=10, metadata=bearer
        )
        assert status.policy_version >= 0
    with grpc.insecure_channel(stack["simulator"].address) as channel:
        stub = sim_pb2_grpc.SimulatorStub(channel)
        # The broker owns these slots; Describe changes nothing.
        assert stub.Describe(sim_pb2.DescribeRequest(), timeout=10, metadata=bearer).num_slots == 2


# The calls added for the gateway that change a run: each refused the same way. After the test above,
# whose check of the refusal log line must see its own call first (refusals are logged at most every 10 s).
MUTATING_LATER = {
    "broker UpdateSettings": (
        "broker",
        broker_pb2_grpc.BrokerStub,
        "UpdateSettings",
        broker_pb2.UpdateSettingsRequest(alpha=0.3),
    ),
    "broker DetachSimulator": (
        "broker",
        broker_pb2_grpc.BrokerStub,
        "DetachSimulator",
        broker_pb2.DetachSimulatorRequest(address="127.0.0.1:1"),
    ),
    "learner UpdateHyperparameters": (
        "learner",
        learner_pb2_grpc.LearnerStub,
        "UpdateHyperparameters",
        learner_pb2.UpdateHyperparametersRequest(learning_rate=0.1),
    ),
    "learner SaveCheckpoint": (
        "learner",
        learner_pb2_grpc.LearnerStub,
        "SaveCheckpoint",
        learner_pb2.SaveCheckpointRequest(),
    ),
}


@pytest.mark.parametrize("call", sorted(MUTATING_LATER))
def test_the_gateway_calls_without_the_token_are_unauthenticated(stack, call: str) -> None:
    service, stub_class, method, request = MUTATING_LATER[call]
    with grpc.insecure_channel(stack[service].address) as channel:
        for metadata in (None, [("authorization", f"Bearer {WRONG}")]):
            with pytest.raises(grpc.RpcError) as refused:
                getattr(stub_class(channel), method)(request, timeout=10, metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_step_stream_without_the_token_ends_unauthenticated(stack) -> None:
    async def go() -> grpc.StatusCode:
        async with SimulatorClient(stack["simulator"].address, credentials=Credentials(WRONG)) as client:
            stream = client.step_stream()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stream.step([0], np.zeros((1, 2), np.float32))
            return refused.value.code()

    assert asyncio.run(go()) == grpc.StatusCode.UNAUTHENTICATED


# -- TLS ------------------------------------------------------------------------------------------


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject: str, issuer_key, issuer: x509.Name | None, *, ca: bool = False, sans=()):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer or _name(subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    certificate = builder.sign(issuer_key or key, hashes.SHA256())
    return key, certificate


def _write_pem(directory: Path, name: str, key, certificate) -> tuple[Path, Path]:
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}-key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return cert_path, key_path


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A CA of the test's own, a server certificate for localhost/127.0.0.1 and a client certificate."""
    directory = tmp_path_factory.mktemp("pki")
    ca_key, ca_cert = _certificate("fast test CA", None, None, ca=True)
    server_key, server_cert = _certificate(
        "fast-sim-server",
        ca_key,
        ca_cert.subject,
        sans=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client_key, client_cert = _certificate("fast-broker", ca_key, ca_cert.subject)
    ca_path, _ = _write_pem(directory, "ca", ca_key, ca_cert)
    server_cert_path, server_key_path = _write_pem(directory, "server", server_key, server_cert)
    client_cert_path, client_key_path = _write_pem(directory, "client", client_key, client_cert)
    return {
        "ca": ca_path,
        "server_cert": server_cert_path,
        "server_key": server_key_path,
        "client_cert": client_cert_path,
        "client_key": client_key_path,
    }


async def _describe(address: str, tls: TlsFiles, timeout_s: float = 5.0) -> int:
    async with SimulatorClient(address, timeout_s=timeout_s, credentials=Credentials(TOKEN, tls)) as client:
        return (await client.describe()).num_slots


def test_tls_server_answers_a_client_with_the_ca_and_no_plaintext_client(pki) -> None:
    async def go() -> None:
        simulator = build_simulator(SimServerConfig(slots=3))
        tls = TlsFiles(cert=pki["server_cert"], key=pki["server_key"])
        server, port, _ = await create_server(simulator, "127.0.0.1:0", env_id="takeover", token=TOKEN, tls=tls)
        try:
            assert await _describe(f"127.0.0.1:{port}", TlsFiles(ca=pki["ca"])) == 3
            assert await _describe(f"localhost:{port}", TlsFiles(ca=pki["ca"])) == 3
            with pytest.raises(grpc.aio.AioRpcError) as plaintext:
                await _describe(f"127.0.0.1:{port}", TlsFiles(), timeout_s=2.0)
            assert plaintext.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            with pytest.raises(grpc.aio.AioRpcError) as wrong_name:  # the certificate does not name it
                await _describe(f"127.0.0.1:{port}", TlsFiles(ca=pki["ca"], server_name="elsewhere"), 2.0)
            assert wrong_name.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        finally:
            await server.stop(None)

    asyncio.run(go())


def test_mutual_tls_simulator_refuses_a_client_without_a_certificate(pki) -> None:
    env = {
        "FAST_SIM_TLS_CERT": str(pki["server_cert"]),
        "FAST_SIM_TLS_KEY": str(pki["server_key"]),
        "FAST_SIM_TLS_CA": str(pki["ca"]),
    }
    with _sim_with_env(env) as service:
        address = service.address
        with_certificate = TlsFiles(cert=pki["client_cert"], key=pki["client_key"], ca=pki["ca"])

        async def go() -> None:
            assert await _describe(address, with_certificate) == 2
            for without in (TlsFiles(ca=pki["ca"]), TlsFiles()):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await _describe(address, without, timeout_s=2.0)
                assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            # The broker's way in: its pool with its certificate.
            pool = SimulatorPool(credentials=Credentials(TOKEN, with_certificate))
            try:
                await pool.add(address)
                assert pool.num_slots == 2
                # Clients of a TLS server show a certificate, which a local step socket cannot check: none.
                assert pool.servers[0].local_step_socket == ""
            finally:
                await pool.close()

        asyncio.run(go())
        health = [
            sys.executable,
            "-m",
            "fast",
            "health",
            address,
            "--tls-ca",
            str(pki["ca"]),
            "--tls-cert",
            str(pki["client_cert"]),
            "--tls-key",
            str(pki["client_key"]),
        ]
        checked = subprocess.run(health, capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0 and "SERVING" in checked.stdout, checked.stderr


@contextmanager
def _sim_with_env(env: dict[str, str]) -> Iterator[ServiceProcess]:
    service = start_service("sim-tls", ["sim-server", "--slots", "2", "--port", "0"], env=env)
    try:
        yield service
    finally:
        service.stop()


def test_tls_settings_need_a_certificate_and_its_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        SimServerConfig(tls_cert=tmp_path / "cert.pem")
    with pytest.raises(ValueError, match="needs its certificate and private key"):
        SimServerConfig(tls_ca=tmp_path / "ca.pem")


# `fast train` runs with a token of its own, not the environment's: tests/test_train.py's run test.

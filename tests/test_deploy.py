"""Deployment files validate offline: Compose with the real Compose program, Kubernetes strictly."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import compose
import pytest
import yaml

from broker.config import BrokerConfig
from fast import auth
from fast.config import ConfigError, resolve_config
from gateway.settings import GatewaySettings
from learner.config import LearnerConfig
from sim_server.config import SimServerConfig

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_BIN = Path(compose.__file__).parent / "docker-compose"  # the Go binary, not the Python wrapper


def _compose_config(path: Path, token: str | None = "a-token-for-validation") -> subprocess.CompletedProcess:
    """`docker compose config -q`, with FAST_AUTH_TOKEN set to `token` (unset when None)."""
    env = {k: v for k, v in os.environ.items() if k != auth.TOKEN_ENV}
    if token is not None:
        env[auth.TOKEN_ENV] = token
    return subprocess.run(
        [str(COMPOSE_BIN), "-f", str(path), "config", "-q"], capture_output=True, text=True, timeout=60, env=env
    )


def test_docker_compose_file_is_valid() -> None:
    result = _compose_config(ROOT / "docker-compose.yml")
    assert result.returncode == 0, result.stderr


def test_compose_refuses_to_start_without_a_token() -> None:
    result = _compose_config(ROOT / "docker-compose.yml", token=None)
    assert result.returncode != 0
    assert "set FAST_AUTH_TOKEN, e.g. export FAST_AUTH_TOKEN=" in result.stderr


def test_compose_validation_catches_errors(tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(
        (ROOT / "docker-compose.yml").read_text().replace("stop_grace_period: 10s", "stop_grace_period: [10]")
    )
    assert _compose_config(broken).returncode != 0


@pytest.mark.parametrize("manifest", sorted((ROOT / "deploy" / "k8s").glob("*.yaml")), ids=lambda p: p.name)
def test_kubernetes_manifest_is_valid(manifest: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", str(manifest)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_image_copies_every_package() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+) ", dockerfile, flags=re.M))
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "benchmarks"}
    assert packages <= copied, f"Dockerfile does not copy {sorted(packages - copied)}"


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _k8s_documents() -> list[dict]:
    return [
        doc
        for path in sorted((ROOT / "deploy" / "k8s").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def _k8s_env(kind: str, name: str) -> dict[str, str]:
    doc = next(d for d in _k8s_documents() if d["kind"] == kind and d["metadata"]["name"] == name)
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    return {item["name"]: item["value"] for item in container.get("env", [])}


_CONFIGS = {
    "FAST_SIM_": SimServerConfig,
    "FAST_LEARNER_": LearnerConfig,
    "FAST_BROKER_": BrokerConfig,
    "FAST_GATEWAY_": GatewaySettings,
}
# FAST_* variables that are no service setting but are read by every service (fast/auth.py).
_SHARED_VARIABLES = auth.TOKEN_VARIABLES | {auth.HOME_ENV}


def _check_settings(environment: dict[str, str], where: str) -> None:
    """Every FAST_* variable names a real setting (or a shared one: the run token), and the settings
    of each service validate."""
    stray = sorted(
        k
        for k in environment
        if k.startswith("FAST_") and k not in _SHARED_VARIABLES and not k.startswith(tuple(_CONFIGS))
    )
    assert not stray, f"{where}: {stray} are no FAST settings"
    for prefix, model in _CONFIGS.items():
        ours = {k: v for k, v in environment.items() if k.startswith(prefix)}
        if not ours:
            continue
        unknown = sorted(k for k in ours if k[len(prefix) :].lower() not in model.model_fields)
        assert not unknown, f"{where}: {unknown} are no settings of {model.__name__}"
        resolve_config(model, environ=ours, env_prefix=prefix)  # raises ConfigError naming the field


def test_compose_settings_are_real_and_the_services_point_at_each_other() -> None:
    services = _compose()["services"]
    assert {"sim-server", "learner", "broker"} <= set(services)
    for name, service in services.items():
        _check_settings(service["environment"], f"docker-compose.yml service {name}")
    broker = services["broker"]["environment"]
    learner_host, learner_port = broker["FAST_BROKER_LEARNER"].rsplit(":", 1)
    assert learner_host == "learner" and learner_port == services["learner"]["environment"]["FAST_LEARNER_PORT"]
    assert (
        broker["FAST_BROKER_SIMULATORS"]
        == f"dns:///sim-server:{services['sim-server']['environment']['FAST_SIM_PORT']}"
    )
    # Each service's health check asks its own port.
    for name, variable in (
        ("sim-server", "FAST_SIM_PORT"),
        ("learner", "FAST_LEARNER_PORT"),
        ("broker", "FAST_BROKER_PORT"),
    ):
        assert services[name]["healthcheck"]["test"][-1] == f"127.0.0.1:{services[name]['environment'][variable]}"
    # The gateway: the broker's and the learner's addresses, its /healthz, and published on loopback only.
    gateway = services["gateway"]
    env = gateway["environment"]
    assert env["FAST_GATEWAY_BROKER"] == f"broker:{services['broker']['environment']['FAST_BROKER_PORT']}"
    assert env["FAST_GATEWAY_LEARNER"] == f"learner:{services['learner']['environment']['FAST_LEARNER_PORT']}"
    assert f"http://127.0.0.1:{env['FAST_GATEWAY_PORT']}/healthz" in gateway["healthcheck"]["test"][-1]
    assert gateway["ports"] == [f"127.0.0.1:{env['FAST_GATEWAY_PORT']}:{env['FAST_GATEWAY_PORT']}"]


def test_kubernetes_settings_are_real_and_the_broker_finds_both_services() -> None:
    sim = _k8s_env("Deployment", "fast-sim-server")
    learner = _k8s_env("Deployment", "fast-learner")
    broker = _k8s_env("Job", "fast-broker")
    for where, environment in (("sim-server", sim), ("learner", learner), ("broker", broker)):
        _check_settings(environment, f"deploy/k8s {where}")
    services = {d["metadata"]["name"]: d for d in _k8s_documents() if d["kind"] == "Service"}
    assert services["fast-sim-server"]["spec"]["clusterIP"] == "None"  # headless: DNS gives every pod
    assert broker["FAST_BROKER_SIMULATORS"] == f"dns:///fast-sim-server:{sim['FAST_SIM_PORT']}"
    assert broker["FAST_BROKER_LEARNER"] == f"fast-learner:{services['fast-learner']['spec']['ports'][0]['port']}"
    assert str(services["fast-learner"]["spec"]["ports"][0]["port"]) == learner["FAST_LEARNER_PORT"]
    gateway = _k8s_env("Deployment", "fast-gateway")
    _check_settings(gateway, "deploy/k8s gateway")
    assert gateway["FAST_GATEWAY_BROKER"] == f"fast-broker:{services['fast-broker']['spec']['ports'][0]['port']}"
    assert gateway["FAST_GATEWAY_LEARNER"] == broker["FAST_BROKER_LEARNER"]
    assert str(services["fast-broker"]["spec"]["ports"][0]["port"]) == broker["FAST_BROKER_PORT"]


def test_settings_check_catches_a_misspelt_variable() -> None:
    with pytest.raises(AssertionError, match="FAST_BROKER_ITERATONS"):
        _check_settings({"FAST_BROKER_ITERATONS": "3"}, "test")
    with pytest.raises(AssertionError, match="FAST_AUTH_TOKN"):
        _check_settings({"FAST_AUTH_TOKN": "x"}, "test")
    _check_settings(
        {"FAST_AUTH_TOKEN_FILE": "/run/token", "FAST_SIM_TLS_CERT": "/c.pem", "FAST_SIM_TLS_KEY": "/k"}, "t"
    )
    with pytest.raises(ConfigError, match="iterations"):
        _check_settings(
            {"FAST_BROKER_SIMULATORS": "a:1", "FAST_BROKER_LEARNER": "b:2", "FAST_BROKER_ITERATIONS": "-1"}, "test"
        )


# -- the run token reaches every service --------------------------------------------------------


def test_compose_gives_every_service_the_token_from_the_shell() -> None:
    for name, service in _compose()["services"].items():
        token = service["environment"].get(auth.TOKEN_ENV, "")
        # Required: compose stops when the variable is unset or empty, never runs with a default.
        assert token.startswith("${FAST_AUTH_TOKEN:?"), f"docker-compose.yml service {name}: {token!r}"
        assert auth.TOKEN_FILE_ENV not in service["environment"]


def _workloads() -> list[dict]:
    return [d for d in _k8s_documents() if d["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet")]


def test_kubernetes_gives_every_workload_the_token_file_from_the_secret() -> None:
    workloads = _workloads()
    assert {w["metadata"]["name"] for w in workloads} == {
        "fast-sim-server",
        "fast-learner",
        "fast-broker",
        "fast-gateway",
    }
    assert not any(d["kind"] == "Secret" for d in _k8s_documents()), "a token must not be committed"
    for workload in workloads:
        where = f"deploy/k8s {workload['kind']} {workload['metadata']['name']}"
        pod = workload["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {item["name"]: item.get("value") for item in container["env"]}
        assert auth.TOKEN_ENV not in env, f"{where}: the token goes in a file, not a variable"
        token_path = Path(env[auth.TOKEN_FILE_ENV])
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        (mount,) = [m for m in mounts.values() if Path(m["mountPath"]) == token_path.parent]
        assert mount.get("readOnly") is True, where
        secret = volumes[mount["name"]]["secret"]
        assert secret["secretName"] == "fast-auth", where
        assert [item["path"] for item in secret["items"] if item["key"] == "token"] == [token_path.name], where
        # Readable by the service (non-root, through fsGroup), not by others: fast/auth.py accepts no more.
        assert secret["defaultMode"] & 0o007 == 0 and pod["securityContext"].get("fsGroup"), where
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        # Probes use the gRPC health service, or the gateway's /healthz and /readyz: none needs a token.
        for probe in ("readinessProbe", "livenessProbe"):
            if probe in container:
                assert "grpc" in container[probe] or container[probe]["httpGet"]["path"] in ("/healthz", "/readyz"), (
                    where
                )


def _ingress_from(component: str) -> list[dict]:
    (policy,) = [
        d
        for d in _k8s_documents()
        if d["kind"] == "NetworkPolicy"
        and d["spec"]["podSelector"]["matchLabels"].get("app.kubernetes.io/component") == component
    ]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    return [peer["podSelector"]["matchLabels"] for rule in policy["spec"]["ingress"] for peer in rule["from"]]


def test_network_policies_let_only_the_broker_reach_simulators_and_learner() -> None:
    broker = {"app.kubernetes.io/name": "fast", "app.kubernetes.io/component": "broker"}
    assert _ingress_from("sim-server") == [broker]
    assert _ingress_from("learner") == [broker, {"app": "fast-gateway"}]
    assert _ingress_from("broker") == [{"app": "fast-gateway"}]  # its control API: the gateway only
    job = next(d for d in _k8s_documents() if d["kind"] == "Job")
    assert broker.items() <= job["spec"]["template"]["metadata"]["labels"].items()


# -- the gateway's container health check ---------------------------------------------------------


def test_compose_health_checks_have_no_argument_with_a_space() -> None:
    # podman's Docker API splits a health check's arguments at spaces (`python -c "import x; ..."`
    # reached the container as `python -c import`): one word per argument runs on Docker and podman.
    for name, service in _compose()["services"].items():
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD" and not any(" " in arg for arg in test), f"{name}: {test}"


def test_fast_health_asks_an_http_url_for_the_gateway() -> None:
    import http.server
    import socket
    import threading

    from typer.testing import CliRunner

    from jobs.cli import app

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/healthz" else 503)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    runner = CliRunner()
    try:
        ok = runner.invoke(app, ["health", f"{base}/healthz"])
        assert ok.exit_code == 0 and "200" in ok.output, ok.output
        assert runner.invoke(app, ["health", f"{base}/readyz"]).exit_code == 1  # 503
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{free.getsockname()[1]}/healthz"
    assert runner.invoke(app, ["health", closed, "--timeout-s", "2"]).exit_code == 1

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


def _compose_config(
    *paths: Path, token: str | None = "a-token-for-validation", quiet: bool = True
) -> subprocess.CompletedProcess:
    """`docker compose -f PATH... config -q` (without -q: the merged model on stdout), with FAST_AUTH_TOKEN
    set to `token` (unset when None)."""
    env = {k: v for k, v in os.environ.items() if k != auth.TOKEN_ENV}
    if token is not None:
        env[auth.TOKEN_ENV] = token
    files = [arg for path in paths for arg in ("-f", str(path))]
    return subprocess.run(
        [str(COMPOSE_BIN), *files, "config", *(["-q"] if quiet else [])],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
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


@pytest.mark.parametrize(
    "manifest",
    sorted((ROOT / "deploy" / "k8s").glob("**/*.yaml")),
    ids=lambda p: str(p.relative_to(ROOT / "deploy" / "k8s")),
)
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
        _check_token_file(workload, f"deploy/k8s {workload['kind']} {workload['metadata']['name']}")


def _check_token_file(workload: dict, where: str) -> None:
    """The workload's one container reads the run token from the Secret fast-auth, mounted read-only and
    private to the service's group, runs as non-root, and probes only what needs no token."""
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
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if probe in container:
            assert "grpc" in container[probe] or container[probe]["httpGet"]["path"] in ("/healthz", "/readyz"), where


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


# -- R learner ranks and a broker per rank (docs/scaling.md) ---------------------------------------

COMPOSE_RANKS = ROOT / "deploy" / "compose.ranks.yml"


def _compose_ranks() -> dict:
    """docker-compose.yml with deploy/compose.ranks.yml over it, as Compose itself merges them."""
    result = _compose_config(ROOT / "docker-compose.yml", COMPOSE_RANKS, quiet=False)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_compose_ranks_file_is_valid() -> None:
    result = _compose_config(ROOT / "docker-compose.yml", COMPOSE_RANKS)
    assert result.returncode == 0, result.stderr
    assert _compose_config(ROOT / "docker-compose.yml", COMPOSE_RANKS, token=None).returncode != 0


def test_compose_ranks_form_one_group_with_a_broker_on_each_rank_and_its_shard() -> None:
    services = _compose_ranks()["services"]
    for name, service in services.items():
        _check_settings(service["environment"], f"compose.ranks.yml service {name}")
        assert service["environment"][auth.TOKEN_ENV] == "a-token-for-validation", name
    learners = {n: s["environment"] for n, s in services.items() if s["command"] == ["learner"]}
    brokers = {n: s["environment"] for n, s in services.items() if s["command"] == ["broker"]}
    world = len(learners)
    assert world >= 2 and len(brokers) == world
    # One group: ranks 0..R-1, one world size, one rendezvous, at rank 0's service and port.
    rank_of = {int(env["FAST_LEARNER_RANK"]): name for name, env in learners.items()}
    assert sorted(rank_of) == list(range(world))
    assert {env["FAST_LEARNER_WORLD_SIZE"] for env in learners.values()} == {str(world)}
    (master,) = {(env["FAST_LEARNER_MASTER_ADDR"], env["FAST_LEARNER_MASTER_PORT"]) for env in learners.values()}
    assert master[0] == rank_of[0]
    assert master[1] in services[rank_of[0]]["expose"]
    for name in learners:  # the rendezvous and the ranks stay on the Compose network
        assert "ports" not in services[name], name
        assert services[name]["volumes"][0]["source"] == "checkpoints", name  # one directory, rank 0 writes it
    # Broker i of R: shard i/R of the same name, learner rank i, a seed and a run directory of its own.
    shards = {}
    for name, env in brokers.items():
        index, count = env["FAST_BROKER_SHARD"].split("/")
        assert int(count) == world, name
        learner = rank_of[int(index)]
        assert env["FAST_BROKER_LEARNER"] == f"{learner}:{learners[learner]['FAST_LEARNER_PORT']}", name
        assert learner in services[name]["depends_on"], name
        shards[int(index)] = env
    assert sorted(shards) == list(range(world))
    assert {env["FAST_BROKER_SIMULATORS"] for env in brokers.values()} == {"dns:///sim-server:50051"}
    for setting in ("FAST_BROKER_SEED", "FAST_BROKER_RUN_DIR"):
        assert len({env.get(setting, "0") for env in brokers.values()}) == world, setting
    # An update waits for every rank's batch: every broker runs as many iterations.
    assert len({env["FAST_BROKER_ITERATIONS"] for env in brokers.values()}) == 1
    assert services["sim-server"]["deploy"]["replicas"] >= world  # a replica per broker at least
    # The gateway: every broker (broker 0 first) and every rank (rank 0 first), published on loopback only.
    gateway = services["gateway"]["environment"]
    broker_of = {int(env["FAST_BROKER_SHARD"].split("/")[0]): name for name, env in brokers.items()}
    assert gateway["FAST_GATEWAY_BROKER"] == ",".join(
        f"{broker_of[i]}:{brokers[broker_of[i]]['FAST_BROKER_PORT']}" for i in range(world)
    )
    assert gateway["FAST_GATEWAY_LEARNER"] == ",".join(
        f"{rank_of[r]}:{learners[rank_of[r]]['FAST_LEARNER_PORT']}" for r in range(world)
    )
    assert services["gateway"]["ports"][0]["host_ip"] == "127.0.0.1"


@pytest.mark.parametrize(
    "files",
    [
        ("docker-compose.yml", "deploy/compose.ranks.yml"),
        ("docker-compose.yml", "deploy/compose.local.yml", "deploy/compose.ranks.yml"),
        ("docker-compose.yml", "deploy/compose.ranks.yml", "deploy/compose.local.yml"),
    ],
    ids=["registry", "local-then-ranks", "ranks-then-local"],
)
def test_compose_ranks_run_one_image_that_the_base_files_services_build(files: tuple[str, ...]) -> None:
    """learner-1 and broker-1 run fast:latest with no build of their own and are never pulled: with a
    registry the base file's services build it as before (`up --build`); with compose.local.yml sim-server
    alone builds it, on the local base, whichever file comes first."""
    result = _compose_config(*(ROOT / f for f in files), quiet=False)
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    assert {s["image"] for s in services.values()} == {"fast:latest"}
    local = "deploy/compose.local.yml" in files
    builders = {"sim-server"} if local else {"sim-server", "learner", "broker", "gateway"}
    assert {name for name, s in services.items() if s.get("build")} == builders
    for name, service in services.items():
        if name in builders:
            assert service["build"]["context"] == str(ROOT), name
            assert ("BASE_IMAGE" in service["build"].get("args", {})) == local, (name, service["build"])
        else:
            assert service["pull_policy"] == "never", name  # no registry has fast:latest


def _ranks_documents() -> list[dict]:
    return [
        doc
        for path in sorted((ROOT / "deploy" / "k8s" / "ranks").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def _pod_env(workload: dict, labels: dict[str, str], annotations: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet gives it to a pod with these labels and annotations:
    fieldRef values filled in, then $(VAR) references to variables defined before expanded."""
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    env: dict[str, str] = {}
    for item in container["env"]:
        if "valueFrom" in item:
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            kind, key = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path).groups()
            env[item["name"]] = (labels if kind == "labels" else annotations)[key]
        else:
            env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], item["value"])
    return env


def test_kubernetes_ranks_form_one_group_with_a_broker_on_each_rank_and_its_shard() -> None:
    docs = _ranks_documents()
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    learners, brokers = by[("StatefulSet", "fast-learner")], by[("Job", "fast-broker")]
    assert {(k, n) for k, n in by if k in ("StatefulSet", "Job", "Deployment")} == {
        ("StatefulSet", "fast-learner"),
        ("Job", "fast-broker"),
        ("Deployment", "fast-gateway"),
    }
    world = learners["spec"]["replicas"]
    assert world >= 2
    # The learner ranks: started together, named by a headless Service that resolves before they are ready.
    headless = by[("Service", learners["spec"]["serviceName"])]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert learners["spec"]["podManagementPolicy"] == "Parallel"
    label = "apps.kubernetes.io/pod-index"
    ranks = [_pod_env(learners, {label: str(r)}, {}) for r in range(world)]
    for rank, env in enumerate(ranks):
        _check_settings(env, f"deploy/k8s/ranks learner rank {rank}")
        assert env["FAST_LEARNER_RANK"] == str(rank) and env["FAST_LEARNER_WORLD_SIZE"] == str(world)
        assert env["FAST_LEARNER_MASTER_ADDR"] == f"fast-learner-0.{headless['metadata']['name']}"
    port = {p["name"]: p["port"] for p in headless["spec"]["ports"]}
    assert str(port["rendezvous"]) == ranks[0]["FAST_LEARNER_MASTER_PORT"]
    assert str(port["grpc"]) == ranks[0]["FAST_LEARNER_PORT"]
    claim = learners["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert by[("PersistentVolumeClaim", claim)]["spec"]["accessModes"] == ["ReadWriteMany"]
    # The brokers: an Indexed Job of R pods at once; broker i drives shard i/R and feeds rank i.
    spec = brokers["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == world
    sim = _k8s_env("Deployment", "fast-sim-server")
    for index in range(world):
        env = _pod_env(brokers, {}, {"batch.kubernetes.io/job-completion-index": str(index)})
        _check_settings(env, f"deploy/k8s/ranks broker {index}")
        assert env["FAST_BROKER_SHARD"] == f"{index}/{world}"
        assert env["FAST_BROKER_LEARNER"] == f"fast-learner-{index}.{headless['metadata']['name']}:{port['grpc']}"
        assert env["FAST_BROKER_SIMULATORS"] == f"dns:///fast-sim-server:{sim['FAST_SIM_PORT']}"
        assert env["FAST_BROKER_SEED"] == str(index) and env["FAST_BROKER_RUN_DIR"].endswith(f"rank-{index}")
    # The gateway (./gateway.yaml) lists every broker and every rank: test_kubernetes_ranks_gateway_*.
    assert not any(d["kind"] == "Secret" for d in docs), "a token must not be committed"
    for workload in (learners, brokers, by[("Deployment", "fast-gateway")]):
        _check_token_file(workload, f"deploy/k8s/ranks {workload['kind']} {workload['metadata']['name']}")


def test_kubernetes_ranks_network_policies() -> None:
    policies = {
        d["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]: d
        for d in _ranks_documents()
        if d["kind"] == "NetworkPolicy"
    }
    broker = {"app.kubernetes.io/name": "fast", "app.kubernetes.io/component": "broker"}
    learner = {"app.kubernetes.io/name": "fast", "app.kubernetes.io/component": "learner"}
    gateway = {"app": "fast-gateway"}
    rules = policies["learner"]["spec"]["ingress"]
    # Brokers and the gateway on the gRPC port; learner pods, and only they, on the rank-to-rank ports
    # (the rendezvous and the ports gloo and NCCL open: any).
    assert [[p["podSelector"]["matchLabels"] for p in rule["from"]] for rule in rules] == [
        [broker, gateway],
        [learner],
    ]
    assert rules[0]["ports"] == [{"port": "grpc", "protocol": "TCP"}] and "ports" not in rules[1]
    assert [p["podSelector"]["matchLabels"] for r in policies["broker"]["spec"]["ingress"] for p in r["from"]] == [
        gateway
    ]
    # The simulators' policy (../sim-server.yaml) admits these brokers by their labels.
    job = next(d for d in _ranks_documents() if d["kind"] == "Job")
    assert broker.items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert _ingress_from("sim-server") == [broker]
    # The gateway of ./gateway.yaml carries the label both admit, and dials the ports they open: the
    # learner's container port named grpc, the brokers' control port.
    (deployment,) = [d for d in _ranks_documents() if d["kind"] == "Deployment"]
    assert gateway.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    (broker_rule,) = policies["broker"]["spec"]["ingress"]
    env = _pod_env(job, {}, {"batch.kubernetes.io/job-completion-index": "0"})
    assert [str(p["port"]) for p in broker_rule["ports"]] == [env["FAST_BROKER_PORT"]]


def _selects(service: dict, workload: dict) -> bool:
    selector = service["spec"]["selector"]
    return selector.items() <= workload["spec"]["template"]["metadata"]["labels"].items()


def _pod_names(docs: list[dict]) -> dict[str, tuple[dict, int]]:
    """HOSTNAME.SUBDOMAIN -> (workload, index) for every pod that cluster DNS names, as Kubernetes names
    them: a StatefulSet's pod NAME-<ordinal> under its serviceName; an Indexed Job's pod NAME-<index>
    (its hostname) under the pod template's subdomain. The name resolves only through a headless Service
    of that name, in the same namespace, that selects the pod."""
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    names: dict[str, tuple[dict, int]] = {}
    for workload in docs:
        spec = workload["spec"]
        if workload["kind"] == "StatefulSet":
            domain, count = spec["serviceName"], spec["replicas"]
        elif workload["kind"] == "Job" and spec.get("completionMode") == "Indexed":
            domain, count = spec["template"]["spec"].get("subdomain"), spec["completions"]
        else:
            continue
        where = f"{workload['kind']} {workload['metadata']['name']}"
        assert domain in services, f"{where}: no Service {domain!r} to name its pods"
        service = services[domain]
        assert service["spec"].get("clusterIP") == "None", f"{where}: Service {domain} is not headless"
        assert _selects(service, workload), f"{where}: Service {domain} does not select its pods"
        others = [w for w in docs if w is not workload and w["kind"] in ("StatefulSet", "Job", "Deployment")]
        assert not [w for w in others if _selects(service, w)], f"Service {domain} selects other pods too"
        for index in range(count):
            names[f"{workload['metadata']['name']}-{index}.{domain}"] = (workload, index)
    return names


def _ranks_gateway() -> GatewaySettings:
    (deployment,) = [d for d in _ranks_documents() if d["kind"] == "Deployment"]
    env = _pod_env(deployment, {}, {})
    _check_settings(env, "deploy/k8s/ranks gateway")
    ours = {k: v for k, v in env.items() if k.startswith("FAST_GATEWAY_")}
    return resolve_config(GatewaySettings, environ=ours, env_prefix="FAST_GATEWAY_")


def test_kubernetes_ranks_gateway_lists_every_broker_and_rank_by_its_pod_name() -> None:
    docs = _ranks_documents()
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    learners, brokers = by[("StatefulSet", "fast-learner")], by[("Job", "fast-broker")]
    world = learners["spec"]["replicas"]
    names = _pod_names(docs)
    settings = _ranks_gateway()
    # Rank r, and broker i, at index r (i) of the lists: rank 0 and broker 0 first, every one once.
    for field, workload, count, env_of in (
        ("learner", learners, world, lambda r: _pod_env(learners, {"apps.kubernetes.io/pod-index": str(r)}, {})),
        (
            "broker",
            brokers,
            brokers["spec"]["completions"],
            lambda i: _pod_env(brokers, {}, {"batch.kubernetes.io/job-completion-index": str(i)}),
        ),
    ):
        addresses = getattr(settings, field)
        assert count == world and len(addresses) == world, f"gateway {field}: {addresses}"
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        grpc = {p["name"]: p["containerPort"] for p in container["ports"]}["grpc"]
        for index, address in enumerate(addresses):
            host, port = address.rsplit(":", 1)
            assert names.get(host) == (workload, index), f"gateway {field} {index}: {host} names no such pod"
            setting = "FAST_LEARNER_PORT" if field == "learner" else "FAST_BROKER_PORT"
            assert port == env_of(index)[setting] == str(grpc), f"gateway {field} {index}: port {port}"


def test_kubernetes_ranks_pod_names_need_a_headless_service_that_selects_them() -> None:
    docs = _ranks_documents()
    job = next(d for d in docs if d["kind"] == "Job")
    without_subdomain = [d for d in docs if d is not job] + [
        {**job, "spec": {**job["spec"], "template": {**job["spec"]["template"], "spec": {"containers": []}}}}
    ]
    with pytest.raises(AssertionError, match="no Service None"):
        _pod_names(without_subdomain)
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "fast-broker-ranks")
    selects_learners = [d for d in docs if d is not service] + [
        {**service, "spec": {**service["spec"], "selector": {"app.kubernetes.io/component": "learner"}}}
    ]
    with pytest.raises(AssertionError, match="does not select its pods"):
        _pod_names(selects_learners)
    with_ip = [d for d in docs if d is not service] + [
        {**service, "spec": {**service["spec"], "clusterIP": "10.0.0.9"}}
    ]
    with pytest.raises(AssertionError, match="is not headless"):
        _pod_names(with_ip)


def test_kubernetes_ranks_gateway_is_the_gateway_but_for_its_upstreams() -> None:
    """./gateway.yaml replaces ../gateway.yaml: the same objects, differing only in the two lists."""

    def without_upstreams(path: Path) -> list[dict]:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        for doc in docs:
            if doc["kind"] == "Deployment":
                (container,) = doc["spec"]["template"]["spec"]["containers"]
                for item in container["env"]:
                    if item["name"] in ("FAST_GATEWAY_BROKER", "FAST_GATEWAY_LEARNER"):
                        item["value"] = "..."
        return docs

    assert without_upstreams(ROOT / "deploy" / "k8s" / "ranks" / "gateway.yaml") == without_upstreams(
        ROOT / "deploy" / "k8s" / "gateway.yaml"
    )

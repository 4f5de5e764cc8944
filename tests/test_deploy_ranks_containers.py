"""deploy/compose.ranks.yml run for real, in containers: two learner ranks in one torch.distributed
group (gloo, rendezvous at learner:29500 on the Compose network), a broker per rank on its shard of 4
sim-server replicas, and one gateway over both, checked from the host through the gateway
(docs/scaling.md, "Docker Compose").

docker-compose.yml, deploy/compose.local.yml (the image built without a registry, once) and
deploy/compose.ranks.yml are used as written; a fourth file of the test's own only makes the run
small and quick (256 transitions a broker an iteration, a checkpoint every 2 versions) and publishes
the gateway on a free port of the host's loopback, not 8080, so that this test and
tests/test_deploy_containers.py never meet. The engine and the Compose program are
tests/container_stack.py's.

Opt-in: several minutes of a 2-core machine (9 containers, an image build on a cold cache). Skipped
unless FAST_CONTAINER_RANKS=1; with it, a machine where podman cannot run containers is a failure.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from pathlib import Path

import pytest
from container_stack import Stack, health_ticker, leftovers, podman_api, remove_leftovers, why_not

pytestmark = [pytest.mark.containers, pytest.mark.slow]

OPT_IN = "FAST_CONTAINER_RANKS"
COMPOSE_FILES = ["docker-compose.yml", "deploy/compose.local.yml", "deploy/compose.ranks.yml"]
PROJECT = "fast-ranks-test"  # neither a user's "fast" nor the other container test's "fast-test"
SERVICES = ("sim-server", "learner", "learner-1", "broker", "broker-1", "gateway")
BROKERS = ("broker", "broker-1")  # broker i on shard i/2, feeding rank i
RANKS = ("learner", "learner-1")
SIMULATORS = 4  # compose.ranks.yml's replicas: two a broker
SLOTS = 8  # docker-compose.yml's FAST_SIM_SLOTS
SAMPLES = 256  # a broker's transitions an iteration: an iteration of a few seconds here
CHECKPOINT_EVERY = 2
ITERATIONS = 4  # trained by both brokers before the checks
ITERATIONS_BOUND = 200  # the brokers end by themselves should the test be killed before `down`


def _free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _small_run(path: Path, gateway_port: int) -> Path:
    """The test's own Compose file, last: small settings the services read, and the gateway's port."""
    brokers = "".join(
        f"""  {name}:
    environment:
      FAST_BROKER_SAMPLES_PER_ITERATION: "{SAMPLES}"
      FAST_BROKER_ITERATIONS: "{ITERATIONS_BOUND}"
"""
        for name in BROKERS
    )
    ranks = "".join(
        f"""  {name}:
    environment:
      FAST_LEARNER_CHECKPOINT_EVERY: "{CHECKPOINT_EVERY}"
"""
        for name in RANKS
    )
    path.write_text(
        f"""services:
{brokers}{ranks}  gateway:
    ports: !override
      - "127.0.0.1:{gateway_port}:8080"
"""
    )
    return path


@pytest.fixture(scope="module")
def podman_ready() -> None:
    if os.environ.get(OPT_IN) != "1":
        pytest.skip(f"opt-in: set {OPT_IN}=1 to bring deploy/compose.ranks.yml up in containers (minutes)")
    reason = why_not(gateway_port=None)  # the gateway's port is a free one
    if reason is not None:
        pytest.fail(f"{OPT_IN}=1 but {reason}")


@pytest.mark.timeout(1800)
def test_compose_ranks_train_in_lockstep_over_both_shards(podman_ready: None, tmp_path: Path) -> None:
    remove_leftovers(PROJECT)  # a previous run killed before its cleanup
    port = _free_loopback_port()
    files = [*COMPOSE_FILES, str(_small_run(tmp_path / "compose.small.yml", port))]
    with podman_api() as docker_host, health_ticker(PROJECT):
        stack = Stack(
            docker_host,
            secrets.token_urlsafe(32),
            project=PROJECT,
            files=files,
            services=SERVICES,
            gateway=f"http://127.0.0.1:{port}",
        )
        try:
            _run(stack)
        finally:
            with stack.step("down -v"):
                stack.compose("down", "-v", "--timeout", "40", timeout=300, check=False)
            stack.http.close()
            left = {kind: leftovers(PROJECT, kind) for kind in ("containers", "volumes", "networks")}
            remove_leftovers(PROJECT)
            print(f"ranks container test steps (s): {json.dumps(stack.timings)}")
    assert not any(left.values()), f"left after down -v: {left}"


def _run(stack: Stack) -> None:
    auth = {"Authorization": f"Bearer {stack.token}"}

    def status() -> dict:
        reply = stack.http.get("/v1/status", headers=auth)
        assert reply.status_code == 200, f"GET /v1/status: {reply.status_code} {reply.text[:500]}"
        return reply.json()

    # One build: sim-server builds fast:latest; learner-1 and broker-1, like the base file's other
    # services under compose.local.yml, have no build of their own (compose.ranks.yml).
    with stack.step("build"):
        built = stack.compose("build", timeout=1500)
    with stack.step("up"):  # returns once each service's dependencies were healthy and it started
        stack.compose("up", "--detach", timeout=900)
    assert sorted(s for s in SERVICES for _ in stack.containers(s)) == sorted(
        [*SERVICES[1:], *["sim-server"] * SIMULATORS]
    ), {s: stack.containers(s) for s in SERVICES}
    images = {stack.inspect(c, "{{.Image}}") for s in SERVICES for c in stack.containers(s)}
    assert len(images) == 1, f"the services run different images: {images}\n{built.stdout[-2000:]}"
    # Only the gateway is published, on the host's loopback; the ranks' rendezvous is not.
    for service in SERVICES:
        for container in stack.containers(service):
            bindings = json.loads(stack.inspect(container, "{{json .HostConfig.PortBindings}}") or "null") or {}
            hosts = {b.get("HostIp") for binds in bindings.values() for b in binds or [] if b.get("HostPort")}
            assert hosts == ({"127.0.0.1"} if service == "gateway" else set()), (container, bindings)

    with stack.step("ready"):
        stack.wait(
            "gateway /readyz (every broker and rank)", SERVICES, 240, lambda: stack.get("/readyz").status_code == 200
        )
    with stack.step("first iteration"):
        stack.wait(
            "both brokers' first iteration",
            SERVICES,
            300,
            lambda: all(b["up"] and b["run"]["iteration"] >= 1 for b in status()["brokers"]),
        )

    def trained() -> dict | None:
        s = status()
        totals = s["totals"]
        if (
            totals["brokers_answered"] == len(BROKERS)
            and totals["ranks_answered"] == len(RANKS)
            and all(b["run"]["iteration"] >= ITERATIONS for b in s["brokers"])
            and not totals["policy_versions_differ"]  # not caught one version apart around an update
            and not totals["learner_policy_versions_differ"]
        ):
            return s
        return None

    with stack.step("train"):
        s = stack.wait(f"{ITERATIONS} iterations on both brokers, in lockstep", SERVICES, 300, trained)
    totals = s["totals"]

    # Both brokers and both ranks, named and ordered as the gateway is given them, with totals.
    assert [b["name"] for b in s["brokers"]] == list(BROKERS), s["brokers"]
    assert [(r["name"], r["rank"]) for r in s["ranks"]] == [(n, i) for i, n in enumerate(RANKS)], s["ranks"]
    assert totals["brokers"] == totals["brokers_answered"] == len(BROKERS), totals
    assert totals["ranks"] == totals["ranks_answered"] == len(RANKS), totals
    runs = [b["run"] for b in s["brokers"]]
    for name, run in zip(BROKERS, runs):
        assert run["state"] == "running" and run["error"] == "", (name, run["state"], run["error"])
        assert run["settings"]["samples_per_iteration"] == SAMPLES, (name, run["settings"])
    assert totals["state"] == "running" and totals["policy_version"] == runs[0]["policy_version"], totals
    for field in ("num_slots", "valid_steps_total", "transitions_total"):
        assert totals[field] == sum(run[field] for run in runs), (field, totals)

    # The shards: two replicas each, all up, none driven by both brokers, all four driven.
    shards = [{x["address"] for x in run["simulators"] if x["up"]} for run in runs]
    assert [len(shard) for shard in shards] == [SIMULATORS // len(BROKERS)] * len(BROKERS), shards
    assert not shards[0] & shards[1] and len(shards[0] | shards[1]) == SIMULATORS, shards
    assert totals["num_slots"] == SIMULATORS * SLOTS, totals

    # The ranks: one version, each rank's own; rank 0 alone wrote a checkpoint, into the shared volume.
    versions = {r["status"]["policy_version"] for r in s["ranks"]}
    assert versions == {totals["learner_policy_version"]} and min(versions) >= ITERATIONS, s["ranks"]
    rank0, rank1 = (r["status"] for r in s["ranks"])
    assert rank0["last_checkpoint"] and rank1["last_checkpoint"] == "", (rank0, rank1)
    checkpoint = Path(stack.inspect_volume("checkpoints")) / Path(rank0["last_checkpoint"]).name
    assert checkpoint.is_file() and checkpoint.stat().st_size > 0, checkpoint
    assert int(checkpoint.stem.split("-")[1]) >= CHECKPOINT_EVERY, checkpoint.name

    # Every broker trained the same iterations with the same policy versions (the ranks' lockstep):
    # broker 0's metrics.jsonl and broker 1's rank-1/metrics.jsonl, on the `run` volume.
    run_volume = Path(stack.inspect_volume("run"))
    lines = [
        [(m["iteration"], m["policy_version"]) for m in map(json.loads, (run_volume / path).read_text().splitlines())]
        for path in ("metrics.jsonl", "rank-1/metrics.jsonl")
    ]
    common = min(map(len, lines))
    assert common >= ITERATIONS and lines[0][:common] == lines[1][:common], lines
    assert [v for _, v in lines[0][:common]] == list(range(common)), lines[0]  # a version an iteration
    stack.timings["iterations trained"] = max(run["iteration"] for run in runs)
    print(
        f"ranks container test: shards {[sorted(shard) for shard in shards]}, learner version {min(versions)}, "
        f"rank 0's checkpoint {checkpoint.name}, metrics lines {[len(x) for x in lines]}, "
        f"transitions {totals['transitions_total']} ({totals['valid_steps_total']} valid)"
    )

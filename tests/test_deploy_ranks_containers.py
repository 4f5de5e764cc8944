"""deploy/compose.ranks.yml run for real, in containers: two learner ranks in one torch.distributed
group (gloo, rendezvous at learner:29500 on the Compose network), a broker per rank on its shard of 4
sim-server replicas, and one gateway over both, checked from the host through the gateway
(docs/scaling.md, "Docker Compose"); then, on the same stack, learner rank 0 and then rank 1 killed past
a checkpoint and brought back by Compose's restart policies alone, every version recorded once
(docs/scaling.md, "Restarting on Compose and Kubernetes").

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
import re
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
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


@pytest.fixture(scope="module")
def stack(podman_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The stack built and up, shared by the tests in file order (the kill after the lockstep checks);
    `down -v` at the end, and nothing of the project left."""
    remove_leftovers(PROJECT)  # a previous run killed before its cleanup
    port = _free_loopback_port()
    files = [*COMPOSE_FILES, str(_small_run(tmp_path_factory.mktemp("compose") / "compose.small.yml", port))]
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
            _up(stack)
            yield stack
        finally:
            with stack.step("down -v"):
                stack.compose("down", "-v", "--timeout", "40", timeout=300, check=False)
            stack.http.close()
            left = {kind: leftovers(PROJECT, kind) for kind in ("containers", "volumes", "networks")}
            remove_leftovers(PROJECT)
            print(f"ranks container test steps (s): {json.dumps(stack.timings)}")
    assert not any(left.values()), f"left after down -v: {left}"


def _status(stack: Stack) -> dict:
    reply = stack.http.get("/v1/status", headers={"Authorization": f"Bearer {stack.token}"})
    assert reply.status_code == 200, f"GET /v1/status: {reply.status_code} {reply.text[:500]}"
    return reply.json()


def _metrics(stack: Stack) -> list[list[tuple[int, int]]]:
    """(iteration, policy_version) of each line of broker 0's metrics.jsonl and broker 1's
    rank-1/metrics.jsonl, on the `run` volume."""
    run_volume = Path(stack.inspect_volume("run"))
    return [
        [(m["iteration"], m["policy_version"]) for m in map(json.loads, (run_volume / path).read_text().splitlines())]
        for path in ("metrics.jsonl", "rank-1/metrics.jsonl")
    ]


def _up(stack: Stack) -> None:
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


@pytest.mark.timeout(1800)
def test_compose_ranks_train_in_lockstep_over_both_shards(stack: Stack) -> None:
    def status() -> dict:
        return _status(stack)

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
    lines = _metrics(stack)
    common = min(map(len, lines))
    assert common >= ITERATIONS and lines[0][:common] == lines[1][:common], lines
    assert [v for _, v in lines[0][:common]] == list(range(common)), lines[0]  # a version an iteration
    stack.timings["iterations trained"] = max(run["iteration"] for run in runs)
    print(
        f"ranks container test: shards {[sorted(shard) for shard in shards]}, learner version {min(versions)}, "
        f"rank 0's checkpoint {checkpoint.name}, metrics lines {[len(x) for x in lines]}, "
        f"transitions {totals['transitions_total']} ({totals['valid_steps_total']} valid)"
    )


RESUME_PATTERN = r"resuming at policy version (\d+): (\d+) iteration\(s\) past it dropped"


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("victim_service", ["learner", "learner-1"])  # rank 0, then rank 1, on the one stack
def test_compose_ranks_resume_after_a_rank_is_killed_past_a_checkpoint(stack: Stack, victim_service: str) -> None:
    """A learner rank SIGKILLed mid-run, past a checkpoint, as a crash or the kernel's OOM killer would.
    Compose's restart policies alone bring the group back: the killed rank is restarted; the other
    fails at once (it sees the restarted rank's mark, or rank 0's store gone: learner/group.py) and is
    restarted; the group forms again from the newest checkpoint (rank 0 killed: the last periodic one,
    the updates past it lost; rank 1 killed: rank 0's final checkpoint); the brokers wait, and drop
    the lines past the version their learner resumed (broker/run.py). Every version is recorded once.

    The kill is the host's `kill -9` of the container's process, not `podman kill`: podman (and the
    Docker API it serves) counts a kill through the engine as the user's stop and does not restart it.
    A rank killed in the few milliseconds between rank 0's checkpoint and its answer would leave its
    broker's line of that version unwritten (docs/scaling.md); this test does not aim there."""
    start = min(b["run"]["iteration"] for b in _status(stack)["brokers"])
    stack.wait(
        "both brokers past a checkpoint",
        SERVICES,
        300,
        lambda: min(b["run"]["iteration"] for b in _status(stack)["brokers"]) >= start + CHECKPOINT_EVERY + 1,
    )
    before = _metrics(stack)[0]
    victim = stack.containers(victim_service)[0]
    restarts = {s: int(stack.inspect(stack.containers(s)[0], "{{.RestartCount}}")) for s in (*RANKS, *BROKERS)}
    killed_at = time.monotonic()
    subprocess.run(["kill", "-9", stack.inspect(victim, "{{.State.Pid}}")], check=True)
    version_at_kill = before[-1][1] + 1  # the learner's version when it died (or one less, mid-update)

    def both_ranks_back() -> dict | None:
        s = _status(stack)
        totals = s["totals"]
        restarted = int(stack.inspect(victim, "{{.RestartCount}}")) > restarts[victim_service]
        back = totals["ranks_answered"] == len(RANKS) and totals["brokers_answered"] == len(BROKERS)
        return s if restarted and back and not totals["learner_policy_versions_differ"] else None

    with stack.step(f"{victim_service} killed: ranks back"):
        stack.wait(f"both ranks answering again after {victim_service}'s kill", SERVICES, 300, both_ranks_back)
    target = version_at_kill + 3

    def trained_on() -> list | None:
        lines = _metrics(stack)
        return lines if min(len(x) for x in lines) >= target else None

    with stack.step(f"{victim_service} killed: trained past it"):
        lines = stack.wait(f"both brokers past version {target}", SERVICES, 300, trained_on)
    stack.timings[f"{victim_service} killed: kill to trained past it"] = round(time.monotonic() - killed_at, 1)

    # Every version once, in order, none skipped, numbered iteration = version + 1, on both brokers.
    for name, found in zip(BROKERS, lines):
        assert [v for _, v in found] == list(range(len(found))), (name, found)
        assert all(i == v + 1 for i, v in found), (name, found)
    s = _status(stack)
    assert [(r["name"], r["rank"]) for r in s["ranks"]] == [(n, i) for i, n in enumerate(RANKS)], s["ranks"]
    assert s["totals"]["ranks_answered"] == len(RANKS) and s["totals"]["brokers_answered"] == len(BROKERS), s
    for b in s["brokers"]:
        assert b["run"]["state"] == "running" and b["run"]["error"] == "", b["run"]

    # What happened: each service's restarts, and where each broker resumed (its log line).
    logs = {b: stack.compose("logs", "--no-color", b, timeout=60, check=False).stdout for b in BROKERS}
    resumed = {b: re.findall(RESUME_PATTERN, logs[b]) for b in BROKERS}  # every resume of the stack so far
    counts = {
        service: int(stack.inspect(stack.containers(service)[0], "{{.RestartCount}}")) for service in (*RANKS, *BROKERS)
    }
    assert all(counts[rank] > restarts[rank] for rank in RANKS), (restarts, counts)  # the whole group restarted
    # Why each rank left its group (a failed collective, or its watch of the store: learner/group.py).
    causes = {
        rank: re.findall(r"ERROR the group of 2 learner ranks failed at policy version \d+ \((.{0,60})", text)
        for rank in RANKS
        for text in [stack.compose("logs", "--no-color", rank, timeout=60, check=False).stdout]
    }
    print(
        f"ranks container kill: {victim_service} killed at version {version_at_kill} (broker 0 had recorded "
        f"{len(before)} lines), restarts {counts}, resumed (version, lines dropped) {resumed}, causes {causes}, "
        f"lines now {[len(x) for x in lines]}, timings {json.dumps(stack.timings)}"
    )

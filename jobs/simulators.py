"""Simulator servers for a job: the workload they must serve, and that many `fast sim-server` processes.

`fast compare` and both benchmarks need the same thing: S simulator servers serving one
workload, started in parallel as a user starts them (jobs/processes.py) and all stopped
afterwards, whatever happened. The workload is what decides which episodes a (clip, seed)
plays, so two policies evaluated on servers of one workload face the same episodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

from jobs.processes import ServiceProcess, start_service


@dataclass(frozen=True)
class Workload:
    """What the simulators must serve for two policies to face the same episodes."""

    env: str
    catalog_args: tuple[str, ...]  # sim-server flags that shape the catalog, e.g. ("--num-clips", "60")
    holdout_every: int

    def describe(self) -> str:
        extra = f" {' '.join(self.catalog_args)}" if self.catalog_args else " (default catalog)"
        return f"env {self.env}{extra}, holdout_every {self.holdout_every}"


def start_simulators(
    workload: Workload,
    servers: int,
    slots: int,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> list[ServiceProcess]:
    """`servers` sim-server processes serving the workload, started in parallel; all stopped if one fails.

    `extra_args`: more `fast sim-server` flags, e.g. ("--cost-preset", "calibrated"); `env`: more
    variables, e.g. the job's run token (jobs/tokens.py: JobToken.env).
    """
    args = [
        "sim-server",
        "--env",
        workload.env,
        "--slots",
        str(slots),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        *workload.catalog_args,
        *extra_args,
    ]
    with ThreadPoolExecutor(max_workers=servers) as executor:
        futures = [executor.submit(start_service, f"sim-server-{i}", args, env=env) for i in range(servers)]
    started, errors = [], []
    for future in futures:
        try:
            started.append(future.result())
        except (RuntimeError, OSError) as exc:
            errors.append(str(exc))
    if errors:
        for service in started:
            service.stop()
        raise RuntimeError(f"simulator server failed to start: {errors[0]}")
    return started


@contextmanager
def simulator_servers(
    workload: Workload,
    servers: int,
    slots: int,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Iterator[list[ServiceProcess]]:
    """`start_simulators`, and every server stopped on exit, whatever happened."""
    started = start_simulators(workload, servers, slots, extra_args, env)
    try:
        yield started
    finally:
        for service in started:
            service.stop()

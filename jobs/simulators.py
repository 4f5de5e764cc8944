"""Simulator servers for a job: the workload they must serve, and that many `fast sim-server` processes.

`fast compare` and both benchmarks need the same thing: S simulator servers serving one
workload, started in parallel as a user starts them (jobs/processes.py) and all stopped
afterwards, whatever happened. The workload is what decides which episodes a (clip, seed)
plays, so two policies evaluated on servers of one workload face the same episodes.

Or the servers are external (`--simulators`, jobs/external.py): `job_simulators` then starts and
stops nothing and hands out their addresses with the environment's token.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fast.rpc import Credentials
from jobs.external import ExternalSimulators
from jobs.processes import ServiceProcess, start_service
from jobs.tokens import temporary_job_token
from sim_server.config import SimServerConfig


@dataclass(frozen=True)
class Workload:
    """What the simulators must serve for two policies to face the same episodes."""

    env: str  # "takeover", "gym:<id>", or an external server's Describe env_id
    catalog_args: tuple[str, ...]  # sim-server flags that shape the catalog, e.g. ("--num-clips", "60")
    holdout_every: int
    # A run on external simulators: the catalog size they described; no command here starts such servers.
    external_clips: int | None = None

    @property
    def external(self) -> bool:
        return self.external_clips is not None

    def describe(self) -> str:
        if self.external:
            clips = f"{self.external_clips} clips"
            return f"external simulators of env {self.env}, {clips}, holdout_every {self.holdout_every}"
        extra = f" {' '.join(self.catalog_args)}" if self.catalog_args else " (default catalog)"
        return f"env {self.env}{extra}, holdout_every {self.holdout_every}"

    def mismatch(self, env_id: str, num_clips: int) -> str:
        """How servers that describe themselves as `env_id` with `num_clips` clips differ from this workload; ""
        when they do not, as far as their description tells (the spaces are checked apart)."""
        if env_id != self.env:
            return f"they serve env {env_id}, not {self.env}"
        expected = self.external_clips
        if expected is None and "--num-clips" in self.catalog_args:
            expected = int(self.catalog_args[self.catalog_args.index("--num-clips") + 1])
        if expected is not None and num_clips != expected:
            return f"they have {num_clips} clips, not {expected}"
        return ""


@dataclass(frozen=True)
class JobSimulators:
    """The simulator servers a job plays on, and the credentials its calls to them carry."""

    addresses: list[str]
    credentials: Credentials
    external: ExternalSimulators | None = None  # not started by the job, never stopped by it


@contextmanager
def job_simulators(
    workload: Workload,
    servers: int,
    slots: int,
    settings: dict[str, Any] | None = None,
    *,
    external: ExternalSimulators | None = None,
) -> Iterator[JobSimulators]:
    """The external simulators as they are, or `servers` sim-server processes with a token of their own,
    stopped on exit whatever happened."""
    if external is not None:
        yield JobSimulators(external.addresses, external.token.credentials, external)
        return
    with temporary_job_token() as token, simulator_servers(workload, servers, slots, settings, token.env) as started:
        yield JobSimulators([s.address for s in started], token.credentials)


def start_simulators(
    workload: Workload,
    servers: int,
    slots: int,
    settings: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> list[ServiceProcess]:
    """`servers` sim-server processes serving the workload, started in parallel; all stopped if one fails.

    `settings`: more of their settings (sim_server/config.py), e.g. {"cost_preset": "calibrated"}; `env`:
    more variables, e.g. the job's run token (jobs/tokens.py: JobToken.env).
    """
    config = SimServerConfig(env=workload.env, slots=slots, host="127.0.0.1", port=0, **(settings or {}))
    args = ["sim-server", *config.to_argv(), *workload.catalog_args]
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
    settings: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[list[ServiceProcess]]:
    """`start_simulators`, and every server stopped on exit, whatever happened."""
    started = start_simulators(workload, servers, slots, settings, env)
    try:
        yield started
    finally:
        for service in started:
            service.stop()

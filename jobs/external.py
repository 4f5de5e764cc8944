"""External simulator servers: ones a job uses but did not start (`--simulators`).

A job given `--simulators HOST:PORT[,HOST:PORT...]` (or `dns:///NAME:PORT`: one server per
address the name resolves to, as the broker reads it, fast/addresses.py `resolve_addresses`) starts
no simulator server and never stops those servers. It cannot hand them a token of its own, so it
uses the token of its environment (jobs/tokens.py `environment_job_token`) for its calls and for
every service it starts: servers started with that same token accept the run.

Before anything starts, `check_simulators` asks every server's Describe: a server that refuses the
token fails the job at once, with the token to give it; one that does not answer yet is asked
again until `wait_s` (it may be starting); servers whose spaces or catalogs differ are refused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import grpc

from fast import auth
from fast.addresses import resolve_addresses, split_host_port
from fast.quoting import shorten
from fast.spaces import space_mismatch
from jobs.tokens import JobToken, environment_job_token
from sim_server.client import ServerDescription, SimulatorClient

FLAG = "--simulators"
FORM = "HOST:PORT[,HOST:PORT...] or dns:///NAME:PORT"
EXTERNAL_WAIT_S = 30.0  # how long a job asks again a server that does not answer yet (it may be starting)
# Describe answers that mean "not there yet": asked again until the wait is over.
_NOT_YET = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class ExternalSimulatorError(ValueError):
    """External simulators that cannot be used as given; the message names the server and the fix."""


@dataclass(frozen=True)
class ExternalServer:
    address: str  # HOST:PORT, a dns:/// spec already resolved
    description: ServerDescription


@dataclass(frozen=True)
class ExternalSimulators:
    """What a job learnt about its external simulators, and the token it reaches them with."""

    specs: tuple[str, ...]  # as given
    servers: tuple[ExternalServer, ...]
    token: JobToken

    @property
    def addresses(self) -> list[str]:
        return [server.address for server in self.servers]

    @property
    def num_slots(self) -> int:
        return sum(server.description.num_slots for server in self.servers)

    @property
    def num_clips(self) -> int:
        return self.servers[0].description.num_clips

    @property
    def env_id(self) -> str:
        return self.servers[0].description.env_id

    def record(self) -> dict:
        """For config files and reports: the addresses and what each server said; never the token."""
        return {
            "specs": list(self.specs),
            "token": self.token.source,
            "servers": [
                {
                    "address": s.address,
                    "env_id": s.description.env_id,
                    "num_slots": s.description.num_slots,
                    "num_clips": s.description.num_clips,
                }
                for s in self.servers
            ],
        }

    def describe(self) -> str:
        return (
            f"external simulators {','.join(self.specs)} ({len(self.servers)} server(s), {self.num_slots} slots, "
            f"env {self.env_id}, {self.num_clips} clips)"
        )


def parse_simulators(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """'a:1,b:2' (or a list of them) -> ('a:1', 'b:2'), each HOST:PORT or dns:///NAME:PORT; not resolved here.

    ValueError naming the address and the form otherwise."""
    if value is None:
        return ()
    parts = [value] if isinstance(value, str) else list(value)
    specs = tuple(item.strip() for part in parts for item in str(part).split(",") if item.strip())
    for spec in specs:
        if spec.startswith("dns:"):
            split_host_port(spec[len("dns:") :].lstrip("/"), form="dns:///NAME:PORT")
        else:
            split_host_port(spec)
    return specs


def env_is_an_address(value: object, variable: str = "") -> str:
    """The fix when an --env value is a simulator address (`fast train --env 127.0.0.1:50051`); "" if it is not."""
    if not isinstance(value, str) or value == "takeover" or value.startswith("gym:"):
        return ""
    try:
        parse_simulators(value)
    except ValueError:
        return ""  # not an address either: the env check names the forms
    return (
        f"{value} is a simulator address, not an environment; to use a server that runs already, give "
        f"{FLAG} {value}{f' (or {variable})' if variable else ''} instead of --env"
    )


def inapplicable(names: Iterable[str]) -> str:
    """The refusal of settings that only shape simulator servers a job starts itself, given with --simulators."""
    names = list(names)
    them = "it" if len(names) == 1 else "them"
    return (
        f"{', '.join(names)} {'does' if len(names) == 1 else 'do'} not apply with {FLAG}: the job starts no "
        f"simulator server, the external ones serve their own workload, slots and costs; remove {them}, "
        "or start the servers with those settings (fast sim-server --help)"
    )


def refusal_message(address: str, details: str, token: JobToken) -> str:
    """What to do when an external server refuses the job's token: give both the same one."""
    hint = f"{auth.TOKEN_FILE_ENV}={token.path} " if token.path is not None else f"{auth.TOKEN_ENV}=... "
    return (
        f"simulator {address} refused the run token (UNAUTHENTICATED: {shorten(details.partition(':')[0], 80)}). "
        f"With {FLAG} the job uses the token of its environment, {token.source}: start that server with the "
        f"same token (e.g. `{hint}fast sim-server ...`), or give this job the server's token in "
        f"{auth.TOKEN_ENV} or {auth.TOKEN_FILE_ENV} (docs/security.md)"
    )


async def describe_simulators(
    specs: Sequence[str], token: JobToken, *, wait_s: float, stopping: Callable[[], bool] = lambda: False
) -> ExternalSimulators:
    """Describe every server of `specs` (dns:/// resolved); ExternalSimulatorError naming the one that fails."""
    addresses: list[str] = []
    for spec in specs:
        try:
            found = resolve_addresses(spec)
        except OSError as exc:
            raise ExternalSimulatorError(f"{FLAG} {spec}: the name does not resolve ({exc})") from None
        addresses += [a for a in found if a not in addresses]
    deadline = time.monotonic() + wait_s
    servers = [ExternalServer(a, await _describe(a, token, deadline, stopping)) for a in addresses]
    first = servers[0]
    for server in servers[1:]:
        a, b = first.description, server.description
        problem = (
            space_mismatch("observation space", a.observation_space, b.observation_space)
            or space_mismatch("action space", a.action_space, b.action_space)
            or (f"catalog of {b.num_clips} clips, not {a.num_clips}" if a.num_clips != b.num_clips else "")
        )
        if problem:
            raise ExternalSimulatorError(
                f"simulator {server.address} does not serve what {first.address} serves: {problem}; "
                f"give {FLAG} servers of one workload"
            )
    return ExternalSimulators(tuple(specs), tuple(servers), token)


async def _describe(address: str, token: JobToken, deadline: float, stopping: Callable[[], bool]) -> ServerDescription:
    while True:
        timeout_s = max(1.0, min(5.0, deadline - time.monotonic()))
        try:
            async with SimulatorClient(address, timeout_s=timeout_s, credentials=token.credentials) as client:
                return await client.describe()
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise ExternalSimulatorError(refusal_message(address, exc.details() or "", token)) from None
            if exc.code() not in _NOT_YET or time.monotonic() >= deadline or stopping():
                raise ExternalSimulatorError(
                    f"simulator {address} did not answer Describe ({exc.code().name}: "
                    f"{shorten(exc.details() or '', limit=200)}); is a `fast sim-server` (or another FAST "
                    f"simulator) listening there? Check {FLAG}"
                ) from None
        await asyncio.sleep(0.5)


async def open_simulators(
    value: str | Sequence[str], *, wait_s: float = EXTERNAL_WAIT_S, stopping: Callable[[], bool] = lambda: False
) -> ExternalSimulators:
    """Parse, resolve and describe the external simulators with the environment's token (see the module)."""
    try:
        specs = parse_simulators(value)
        if not specs:
            raise ExternalSimulatorError(f"{FLAG} is empty; give {FORM}")
        token = environment_job_token()
    except auth.AuthError as exc:
        raise ExternalSimulatorError(f"the run token for {FLAG}: {exc}") from None
    except ExternalSimulatorError:
        raise
    except ValueError as exc:
        raise ExternalSimulatorError(f"{FLAG}: {exc}") from None
    return await describe_simulators(specs, token, wait_s=wait_s, stopping=stopping)


def check_simulators(
    value: str | Sequence[str], *, wait_s: float = EXTERNAL_WAIT_S, stopping: Callable[[], bool] = lambda: False
) -> ExternalSimulators:
    """`open_simulators` from synchronous code."""
    return asyncio.run(open_simulators(value, wait_s=wait_s, stopping=stopping))

"""Process shell of the learner: gRPC server, health, reflection, signals, final checkpoint.

`create_server` builds and starts a server for a `LearnerCore` on an address (port 0 picks a
free one), the run token required on every call but health and reflection, and returns it with
the bound port; `serve` runs one until SIGTERM or SIGINT, then drains in-flight calls for
`grace_s`, writes a final checkpoint and returns (the process exits 0).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

import grpc
from grpc_health.v1 import health

from fast.lifecycle import run_until_signal
from fast.rpc import display_address, start_server
from fast.tls import TlsFiles
from fast.v1 import learner_pb2 as pb
from fast.v1 import learner_pb2_grpc as pb_grpc
from learner.config import LearnerConfig
from learner.core import LearnerCore
from learner.device import pick_device
from learner.distributed import Ranks
from learner.group import WATCH_S, GroupSettings, group_broken, group_settings, join_group, leave_group, rank_device
from learner.servicer import LearnerServicer

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Learner"].full_name


async def create_server(
    core: LearnerCore,
    address: str,
    *,
    max_message_bytes: int = 256 << 20,
    token: str | None = None,
    tls: TlsFiles | None = None,
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """`token`: the run token every call must carry (None: the environment's, fast/auth.py)."""
    servicer = LearnerServicer(core)
    return await start_server(
        address,
        SERVICE_NAME,
        lambda server: pb_grpc.add_LearnerServicer_to_server(servicer, server),
        max_message_bytes=max_message_bytes,
        token=token,
        tls=tls,
    )


async def serve(config: LearnerConfig) -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="fast learner: %(levelname)s %(message)s")
    # One rank alone unless the settings or torchrun's environment make a group (learner/group.py).
    group = group_settings(config)
    config = config.model_copy(update={"device": rank_device(config, group)})
    ranks = store = None
    if group.world_size > 1:
        ranks, store = await asyncio.to_thread(
            join_group, group, pick_device(config.device), config.rank_timeout_s, _announce_rendezvous
        )
    try:
        await _serve_rank(config, ranks, None if group.agent_store else store)
    finally:
        leave_group()


def _announce_rendezvous(address: str, settings: GroupSettings) -> None:
    # With --master-port 0 this is where the other ranks learn the port rank 0 bound.
    print(
        f"fast learner rank {settings.rank} of {settings.world_size}: rendezvous at {address}, waiting for the "
        "other ranks",
        flush=True,
    )


async def _watch_group(core: LearnerCore, store, rank: int, stopping: asyncio.Event) -> None:
    """A rank of a formed group: fail it as soon as its store says the group is over (a rank restarted
    alone, or rank 0 gone; learner/group.py), not at its next collective, which may be an iteration away.
    Quiet once the process is stopping: rank 0 leaving at a normal stop is no failure."""
    while not stopping.is_set():
        await asyncio.sleep(WATCH_S)
        cause = await asyncio.to_thread(group_broken, store, rank)
        if cause and not stopping.is_set() and core.group_failure is None:
            core.fail_group(cause)
            return


async def _serve_rank(config: LearnerConfig, ranks: Ranks | None, store=None) -> None:
    # Resuming (reading the newest checkpoint) happens before binding: a learner that
    # listens already knows its version.
    core = LearnerCore(config, ranks)
    # A failed group (learner/core.py: group_failure) stops this rank the way SIGTERM does, then exits 1.
    core.on_group_failure = lambda: os.kill(os.getpid(), signal.SIGTERM)
    address = f"{config.host}:{config.port}"
    server, port, health_servicer = await create_server(
        core, address, max_message_bytes=config.max_message_bytes, tls=config.tls
    )
    rank = "" if ranks is None else f" rank={ranks.rank}/{ranks.world_size}"
    # Tests and `fast train` read the bound address from this line.
    print(
        f"fast learner listening on {display_address(config.host, port)} device={core.device_name} "
        f"version={core.policy_version} initialized={str(core.initialized).lower()} "
        f"checkpoint_dir={config.checkpoint_dir}{rank}",
        flush=True,
    )

    stopping = asyncio.Event()
    watch = asyncio.ensure_future(_watch_group(core, store, ranks.rank, stopping)) if store is not None else None
    try:
        await run_until_signal("fast learner", server, health_servicer, config.grace_s, stopping)
    finally:
        if watch is not None:
            watch.cancel()
    final = await core.close()
    if final is not None:
        message = f"final checkpoint {final} version={core.policy_version}"
    elif ranks is not None and ranks.rank != 0:
        message = f"rank {ranks.rank} stopped at version {core.policy_version}; rank 0 writes the checkpoints"
    elif core.initialized:
        message = f"stopped at version {core.policy_version}, which the latest checkpoint already holds"
    else:
        message = "stopped before Initialize; nothing to checkpoint"
    print(f"fast learner {message}", file=sys.stderr, flush=True)
    if core.group_failure is not None:
        raise SystemExit(f"fast learner: {core.group_failure}")

"""How `fast learner` joins its group of data-parallel ranks (torch.distributed) as it starts.

The group is given by four settings (learner/config.py), each unset one taken from torchrun's
environment, else one rank alone:

| setting | torchrun's variable | alone |
| --- | --- | --- |
| `world_size` | `WORLD_SIZE` | 1 |
| `rank` | `RANK` | 0 |
| `master_addr` | `MASTER_ADDR` | 127.0.0.1 |
| `master_port` | `MASTER_PORT` | 29500 |

and `LOCAL_RANK` (torchrun's) picks `cuda:<LOCAL_RANK>` when the device is left unset or `cuda`.
World size 1 joins nothing: the learner is the single learner, exactly as without ranks.

The rendezvous is torch's TCPStore. Rank 0 serves it on a socket of its own bound to
`master_addr:master_port` only (TCPStore alone would listen on every interface): 127.0.0.1, the
default, keeps a one-machine group on loopback, and so do gloo's rank-to-rank connections, which
are pinned to the loopback interface then (`GLOO_SOCKET_IFNAME`, unless set). Under torchrun
(`TORCHELASTIC_USE_AGENT_STORE=True`) the agent serves the store and rank 0 connects to it like the
others. Every rank joins over gloo; when every rank's learner is on a GPU of its own, the updates'
reductions go over an NCCL group of the same ranks (learner.distributed.Ranks), otherwise (a rank on
the CPU, or ranks sharing one GPU, which NCCL refuses) over gloo through host memory.

**A rank restarted alone** (Compose's or Kubernetes' restart policy; torchrun restarts every rank
together and is left to itself): rank 0's store outlives a rank r != 0 that died, so the restarted
rank finds its own seat (`fast/joined/r`) taken, by its predecessor. It does not join that group,
whose gloo pairs are its predecessor's: it marks the store (`fast/rejoined`) and waits for the store
to go, then joins the next one. Every rank of a formed group watches the store (`group_broken`,
about once a second): the mark, or a store gone (rank 0 left), fails the rank at once (exit 1), rather
than at its next collective, so the platform restarts the survivors and the group forms again from
the last checkpoint.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from fast.quoting import quote
from learner.config import LearnerConfig
from learner.distributed import Ranks

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500
REJOINED = "fast/rejoined"  # set by a restarted rank in its predecessor's store: that group is over
WATCH_S = 1.0  # how often a rank of a formed group looks at its store (group_broken)

log = logging.getLogger("fast.learner")


@dataclass(frozen=True)
class GroupSettings:
    """Where this learner stands in its group of ranks."""

    world_size: int
    rank: int
    master_addr: str
    master_port: int
    local_rank: int | None  # torchrun's LOCAL_RANK: this rank's device index on its machine
    agent_store: bool = False  # torchrun's agent serves the store already: rank 0 connects like the others


def group_settings(config: LearnerConfig, environ: Mapping[str, str] = os.environ) -> GroupSettings:
    """The config's settings, each unset one from torchrun's variables, else one rank alone; ValueError
    naming the setting, the variable and the value when they do not make a group."""

    def setting(value: object, variable: str, default: object, convert: type) -> object:
        if value is not None:
            return value
        raw = environ.get(variable, "")
        if raw == "":
            return default
        try:
            return convert(raw)
        except ValueError:
            raise ValueError(f"${variable} is {quote(raw)}: expected an integer") from None

    settings = GroupSettings(
        world_size=setting(config.world_size, "WORLD_SIZE", 1, int),
        rank=setting(config.rank, "RANK", 0, int),
        master_addr=setting(config.master_addr, "MASTER_ADDR", DEFAULT_MASTER_ADDR, str),
        master_port=setting(config.master_port, "MASTER_PORT", DEFAULT_MASTER_PORT, int),
        local_rank=setting(None, "LOCAL_RANK", None, int),
        agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
    )
    if settings.world_size < 1:
        raise ValueError(f"world_size (or $WORLD_SIZE) is {settings.world_size}: a group needs at least 1 rank")
    if not 0 <= settings.rank < settings.world_size:
        raise ValueError(
            f"rank (or $RANK) is {settings.rank} for world_size {settings.world_size}: "
            f"ranks are 0 to {settings.world_size - 1}"
        )
    if not 0 <= settings.master_port < 65536 or (settings.master_port == 0 and settings.rank != 0):
        raise ValueError(
            f"master_port (or $MASTER_PORT) is {settings.master_port} on rank {settings.rank}: expected 1 to 65535 "
            "(0, a free port, on rank 0 only: the others need the one it printed)"
        )
    return settings


def rank_device(config: LearnerConfig, settings: GroupSettings) -> str | None:
    """The device setting this rank uses: `cuda:<LOCAL_RANK>` for an unset or plain `cuda` device
    when torchrun gave a LOCAL_RANK and CUDA is present, else the config's."""
    if settings.local_rank is None or config.device not in (None, "cuda") or not torch.cuda.is_available():
        return config.device
    return f"cuda:{settings.local_rank}"


def rendezvous_store(host: str, port: int, *, is_master: bool, timeout_s: float) -> dist.TCPStore:
    """torch's TCPStore at host:port. The master serves it on a socket bound to `host` alone (port
    0 picks a free one: the store's `.port`); the others connect to it."""
    timeout = timedelta(seconds=timeout_s)
    if not is_master:
        return dist.TCPStore(host, port, is_master=False, timeout=timeout)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(128)
        # The store takes the socket over (and closes it with itself).
        return dist.TCPStore(
            host,
            listener.getsockname()[1],
            is_master=True,
            timeout=timeout,
            master_listen_fd=listener.detach(),
            use_libuv=False,
        )
    except BaseException:
        listener.close()
        raise


# How long the ranks may take to all start, apart from rank_timeout_s (how long a started group may
# wait in a collective): start-up is slow where collectives are not.
JOIN_TIMEOUT_S = 300.0


def join_group(
    settings: GroupSettings,
    device: torch.device,
    timeout_s: float,
    announce: Callable[[str, GroupSettings], None] | None = None,
) -> tuple[Ranks | None, dist.Store | None]:
    """Join the group (blocks until every rank has joined, `timeout_s` at most); (None, None) for one
    rank alone, else this rank and the rendezvous store (for `group_broken`). `announce(HOST:PORT,
    settings)` is called once the rendezvous address is known (on rank 0, once its store listens: the
    port it bound when master_port is 0)."""
    if settings.world_size == 1:
        return None, None
    if _is_loopback(settings.master_addr) and "GLOO_SOCKET_IFNAME" not in os.environ:
        interface = _loopback_interface()
        if interface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    joining_s = max(timeout_s, JOIN_TIMEOUT_S)
    deadline = time.monotonic() + joining_s
    while True:
        store = rendezvous_store(
            settings.master_addr,
            settings.master_port,
            is_master=settings.rank == 0 and not settings.agent_store,
            timeout_s=joining_s,
        )
        if announce is not None:
            host = f"[{settings.master_addr}]" if ":" in settings.master_addr else settings.master_addr
            announce(f"{host}:{store.port}", settings)
        if take_seat(store, settings):
            break
        # A predecessor of this rank sat here: the store is an earlier group's, whose rank 0 still runs.
        log.warning(
            "rank %d: the rendezvous at %s:%d is an earlier group's (this rank's seat is taken); marked it, "
            "waiting for it to go",
            settings.rank,
            settings.master_addr,
            settings.master_port,
        )
        store.set(REJOINED, str(settings.rank))
        while not _store_gone(store):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"rank {settings.rank}: the rendezvous at {settings.master_addr}:{settings.master_port} still "
                    f"serves an earlier group after {joining_s:g} s; restart rank 0"
                )
            time.sleep(WATCH_S)
        del store  # its connection to the earlier rank 0's store; the next one is the new rank 0's
    # Every rank present before the group forms: gloo's own connect waits only `timeout_s`, the
    # collectives' bound, and a rank that starts slower than that (imports on a loaded machine, an
    # image still being pulled) would fail the group before it ever existed.
    store.wait([f"fast/joined/{rank}" for rank in range(settings.world_size)], timedelta(seconds=joining_s))
    dist.init_process_group(
        "gloo",
        store=store,
        rank=settings.rank,
        world_size=settings.world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())  # set_device needs the index
    gpus: list[str | None] = [None] * settings.world_size
    dist.all_gather_object(gpus, _gpu_identity(device))
    why_not = why_not_nccl(gpus)
    if not why_not:
        torch.cuda.set_device(device)
        return Ranks(dist.new_group(backend="nccl", timeout=timedelta(seconds=timeout_s))), store
    if settings.rank == 0 and any(gpus):
        log.warning("the ranks reduce over gloo through host memory, not NCCL: %s", why_not)
    return Ranks(), store


def _gpu_identity(device: torch.device) -> str | None:
    """What tells this rank's GPU apart from every other GPU of the group, or None on the CPU: its
    UUID (two containers on one machine see the same GPU under different host names)."""
    if device.type != "cuda":
        return None
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return str(uuid) if uuid is not None else f"{socket.gethostname()}/cuda:{device.index}"


def why_not_nccl(gpus: list[str | None]) -> str:
    """Why the ranks whose GPUs are `gpus` (None: a rank on the CPU) cannot reduce over NCCL, or ""
    when they can: NCCL needs every rank on a GPU of its own ("Duplicate GPU detected" otherwise),
    as two ranks started on a one-GPU machine, or a mixed CPU/GPU group, are not."""
    on_cpu = [rank for rank, gpu in enumerate(gpus) if gpu is None]
    if on_cpu:
        return f"rank(s) {on_cpu} of {len(gpus)} compute on the CPU"
    shared = sorted({gpu for gpu in gpus if gpus.count(gpu) > 1})
    if shared:
        ranks = [[rank for rank, gpu in enumerate(gpus) if gpu == one] for one in shared]
        return f"ranks {ranks} share a GPU (NCCL needs one GPU per rank: give each rank its own device)"
    return ""


def take_seat(store: dist.Store, settings: GroupSettings) -> bool:
    """Mark this rank present in the store; False when a process of this rank was there before (the
    store is an earlier group's). Under torchrun's agent store every rank restarts together, and the
    agent's store outlives its rounds: the seat is taken without that check."""
    seat = f"fast/joined/{settings.rank}"
    if settings.agent_store:
        store.set(seat, "1")
        return True
    return store.add(seat, 1) == 1


def group_broken(store: dist.Store, rank: int) -> str:
    """Why the group of this store can no longer update, or "": a rank restarted (REJOINED), or the
    store is gone (rank 0, which serves it, left). One round trip to rank 0's store."""
    try:
        if not store.check([REJOINED]):
            return ""
        restarted = store.get(REJOINED).decode()
    except (RuntimeError, OSError) as error:  # torch's DistStoreError / DistNetworkError are RuntimeErrors
        return "" if rank == 0 else f"rank 0's rendezvous store is gone, rank 0 left ({type(error).__name__})"
    return f"rank {restarted} restarted and waits for a new group"


def _store_gone(store: dist.Store) -> bool:
    try:
        store.check([REJOINED])
    except (RuntimeError, OSError):
        return True
    return False


def leave_group() -> None:
    """Tear down the process group, if one was joined."""
    if dist.is_initialized():
        dist.destroy_process_group()


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _loopback_interface() -> str | None:
    names = [name for _, name in socket.if_nameindex()]
    return next((name for name in names if name.startswith("lo")), None)

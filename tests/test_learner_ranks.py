"""`fast learner` as one rank of a data-parallel group: two real learner processes on loopback.

Rank 0 binds its rendezvous on 127.0.0.1 at a free port (--master-port 0) and prints it; rank 1
joins there. A test client feeds each rank its own batch over gRPC, at once: both answer the same
new version with bit-identical weights, equal to one learner's on the union of the two batches;
rank 0 alone writes checkpoints; restarted, both ranks resume the newest one.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from test_distributed_learner import union
from test_learner_service import ACTION_SPACE, FAST_PPO, OBS_DIM, OBS_SPACE, make_arrays

from jobs.processes import Launch, ServiceProcess, StartupError, launch, stop, wait_listening
from learner.batch import RolloutBatch
from learner.client import LearnerClient
from learner.config import LearnerConfig
from learner.distributed import state_digest
from learner.group import REJOINED, GroupSettings, group_broken, group_settings, take_seat, why_not_nccl
from learner.policy import ActionSpec, ActorCritic, import_weights
from learner.ppo import PPOLearner

START_TIMEOUT_S = 60.0
_RENDEZVOUS = re.compile(r"rendezvous at (\S+):(\d+),")


def _wait_for_line(child: Launch, pattern: re.Pattern, deadline: float) -> re.Match:
    while time.monotonic() < deadline:
        for line in list(child.lines):
            match = pattern.search(line)
            if match:
                return match
        if child.process.poll() is not None:
            break
        time.sleep(0.05)
    raise StartupError(f"{child.name} printed no {pattern.pattern!r}: {' | '.join(child.lines[-20:])}")


@contextmanager
def two_ranks(checkpoint_dir: Path, rank_timeout_s: float = 60) -> Iterator[list[ServiceProcess]]:
    """Rank 0 and rank 1 of a 2-rank group, each serving on 127.0.0.1:<free port>; both stopped on exit."""
    common = ["learner", "--host", "127.0.0.1", "--port", "0", "--checkpoint-dir", str(checkpoint_dir), *FAST_PPO]
    common += ["--checkpoint-every", "1", "--world-size", "2", "--master-addr", "127.0.0.1"]
    common += ["--rank-timeout-s", str(rank_timeout_s)]
    children: list[Launch] = []
    try:
        children.append(launch("learner-rank0", [*common, "--rank", "0", "--master-port", "0"]))
        deadline = time.monotonic() + START_TIMEOUT_S
        port = _wait_for_line(children[0], _RENDEZVOUS, deadline).group(2)
        children.append(launch("learner-rank1", [*common, "--rank", "1", "--master-port", port]))
        yield [wait_listening(child, deadline) for child in children]
    finally:
        for child in children:
            stop(child, timeout_s=10)


def _union_learner_weights(batches: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    """One learner, built as `fast learner` builds it with these settings, after one update on the union."""
    config = LearnerConfig(update_epochs=2, num_minibatches=2)
    torch.manual_seed(config.seed)
    policy = ActorCritic(
        (OBS_DIM,), ActionSpec.coerce(ACTION_SPACE), config.hidden_sizes, init_log_std=config.init_log_std
    )
    learner = PPOLearner(policy, config.ppo_config(), device="cpu")
    learner.update(union([RolloutBatch.from_numpy({**arrays, "policy_version": 0}) for arrays in batches]))
    return learner.policy.state_dict()


def _digest(weights: bytes) -> str:
    policy = ActorCritic(OBS_DIM, ACTION_SPACE)
    import_weights(policy, weights)
    return state_digest(policy)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_two_learner_ranks_update_together_resume_and_fail_together_when_a_rank_has_no_batch(tmp_path: Path) -> None:
    checkpoint_dir = tmp_path / "checkpoints"
    # Other shapes and padding on each rank.
    batches = [make_arrays(seed=1, steps=16, slots=4), make_arrays(seed=2, steps=10, slots=3)]

    async def first_run(addresses: list[str]) -> list:
        clients = [LearnerClient(address, update_timeout_s=60) for address in addresses]
        try:
            for client in clients:
                assert await client.initialize(OBS_SPACE, ACTION_SPACE) == (0, False)
                assert client.world_size == 2
            # Rank 0's broker was asked to pause, rank 1's to stop: both are told both, after this batch.
            replies = await asyncio.gather(
                *(
                    client.submit(b, policy_version=0, pause_requested=rank == 0, stop_requested=rank == 1)
                    for rank, (client, b) in enumerate(zip(clients, batches))
                )
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await clients[1].save_checkpoint()
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "rank 0's learner writes checkpoints" in refused.value.details()
            return replies
        finally:
            for client in clients:
                await client.close()

    with two_ranks(checkpoint_dir) as ranks:
        assert [_listening_line(r).endswith(f" rank={i}/2") for i, r in enumerate(ranks)] == [True] * 2
        replies = asyncio.run(first_run([rank.address for rank in ranks]))
        if torch.cuda.device_count() == 1:  # both ranks on the one GPU: NCCL would refuse them
            assert any("share a GPU" in line for line in ranks[0].output), ranks[0].output[-5:]
    assert [reply.policy_version for reply in replies] == [1, 1]
    assert [(reply.run_pauses, reply.run_stops) for reply in replies] == [(True, True)] * 2
    digests = [_digest(reply.policy.weights) for reply in replies]
    assert digests[0] == digests[1]
    assert [reply.stats["num_valid"] for reply in replies] == [int(sum(b["valid_mask"].sum() for b in batches))] * 2
    expected = _union_learner_weights(batches)
    policy = ActorCritic(OBS_DIM, ACTION_SPACE)
    import_weights(policy, replies[0].policy.weights)
    for name, tensor in policy.state_dict().items():
        assert torch.allclose(tensor, expected[name], atol=1e-5, rtol=0), name
    assert sorted(path.name for path in checkpoint_dir.glob("ckpt-*.pt")) == ["ckpt-000000000.pt", "ckpt-000000001.pt"]

    async def statuses(addresses: list[str]) -> list:
        clients = [LearnerClient(address) for address in addresses]
        try:
            return [await client.status() for client in clients]
        finally:
            for client in clients:
                await client.close()

    async def submit_to_rank_0_only(addresses: list[str]) -> grpc.aio.AioRpcError:
        clients = [LearnerClient(address, update_timeout_s=60) for address in addresses]
        try:
            for client in clients:
                await client.initialize(OBS_SPACE, ACTION_SPACE)
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await clients[0].submit(make_arrays(seed=1), policy_version=1)
            return failed.value
        finally:
            for client in clients:
                await client.close()

    # The resumed group, and then (the same group: one start of two ranks serves both checks) rank 1 left
    # without a batch: rank 0's SubmitBatch is UNAVAILABLE after rank_timeout_s, nothing changed, and rank 0
    # stops with exit code 1, so that torchrun (or the platform) restarts the group.
    with two_ranks(checkpoint_dir, rank_timeout_s=10) as ranks:
        assert all("version=1 initialized=true" in _listening_line(r) for r in ranks)
        assert [status.policy_version for status in asyncio.run(statuses([r.address for r in ranks]))] == [1, 1]
        error = asyncio.run(submit_to_rank_0_only([rank.address for rank in ranks]))
        assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
        assert "the group of 2 learner ranks failed at policy version 1" in error.details()
        assert "sent no batch within rank_timeout_s=10 s; nothing was updated, rank 0 stops" in error.details()
        assert ranks[0].process.wait(timeout=30) == 1
        assert any("the group of 2 learner ranks failed" in line for line in ranks[0].output[-5:])
    assert sorted(path.name for path in checkpoint_dir.glob("ckpt-*.pt")) == ["ckpt-000000000.pt", "ckpt-000000001.pt"]


def test_group_settings_come_from_the_config_then_torchruns_environment_then_one_rank() -> None:
    alone = group_settings(LearnerConfig(), environ={})
    assert alone == GroupSettings(world_size=1, rank=0, master_addr="127.0.0.1", master_port=29500, local_rank=None)
    torchrun = {"WORLD_SIZE": "4", "RANK": "2", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29400", "LOCAL_RANK": "0"}
    torchrun["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    assert group_settings(LearnerConfig(), environ=torchrun) == GroupSettings(4, 2, "10.1.2.3", 29400, 0, True)
    given = LearnerConfig(world_size=2, rank=1, master_addr="127.0.0.1", master_port=1234)
    assert group_settings(given, environ=torchrun) == GroupSettings(2, 1, "127.0.0.1", 1234, 0, True)


@pytest.mark.parametrize(
    ("settings", "environ", "message"),
    [
        ({"world_size": 2, "rank": 2}, {}, "rank (or $RANK) is 2 for world_size 2: ranks are 0 to 1"),
        ({"world_size": 2, "rank": 1, "master_port": 0}, {}, "master_port (or $MASTER_PORT) is 0 on rank 1"),
        ({}, {"WORLD_SIZE": "two"}, "$WORLD_SIZE is 'two': expected an integer"),
    ],
)
def test_group_settings_refuse_what_makes_no_group(settings: dict, environ: dict, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        group_settings(LearnerConfig(**settings), environ=environ)
    assert message in str(refused.value)


def _listening_line(service: ServiceProcess) -> str:
    return next(line for line in service.output if "listening on" in line)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_rank_restarted_alone_ends_the_old_group_and_joins_the_next(tmp_path: Path) -> None:
    """Compose's and Kubernetes' restart: rank 1 dies and is started again alone while rank 0 still serves
    the old group's store. The new rank 1 finds its seat taken and marks the store; rank 0 sees the mark
    within a second or so and exits 1 without waiting for a batch; rank 0 started again (its platform's
    restart) forms the next group with the waiting rank 1 (learner/group.py)."""
    checkpoint_dir = tmp_path / "checkpoints"
    common = ["learner", "--host", "127.0.0.1", "--port", "0", "--checkpoint-dir", str(checkpoint_dir), *FAST_PPO]
    common += ["--world-size", "2", "--master-addr", "127.0.0.1"]
    children: list[Launch] = []
    try:
        with two_ranks(checkpoint_dir) as ranks:
            port = _RENDEZVOUS.search("\n".join(ranks[0].output)).group(2)
            ranks[1].process.kill()
            ranks[1].process.wait(timeout=10)
            children.append(launch("learner-rank1-again", [*common, "--rank", "1", "--master-port", port]))
            _wait_for_line(
                children[0], re.compile(r"rank 1: the rendezvous .* is an earlier group's"), time.monotonic() + 60
            )
            marked = time.monotonic()
            assert ranks[0].process.wait(timeout=30) == 1
            left_s = time.monotonic() - marked
            assert any("rank 1 restarted and waits for a new group" in line for line in ranks[0].output), ranks[
                0
            ].output[-5:]
        children.append(launch("learner-rank0-again", [*common, "--rank", "0", "--master-port", port]))
        deadline = time.monotonic() + START_TIMEOUT_S
        again = [wait_listening(child, deadline) for child in children]
        assert [_listening_line(r).endswith(f" rank={i}/2") for i, r in zip((1, 0), again)] == [True, True]
        assert left_s < 25, left_s  # the watch's second, the drain, and the process's exit
        print(f"rank 0 left {left_s:.1f} s after the restarted rank 1 marked its store")
    finally:
        for child in children:
            stop(child, timeout_s=10)


def _seat_settings(rank: int, agent_store: bool = False) -> GroupSettings:
    return GroupSettings(
        world_size=2, rank=rank, master_addr="127.0.0.1", master_port=1, local_rank=None, agent_store=agent_store
    )


def test_nccl_only_when_every_rank_has_a_gpu_of_its_own() -> None:
    """NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): two ranks started on a one-GPU
    machine, as this module's tests do on a CUDA machine, reduce over gloo instead."""
    assert why_not_nccl(["GPU-a", "GPU-b"]) == ""
    assert why_not_nccl(["GPU-a", "GPU-a"]) == (
        "ranks [[0, 1]] share a GPU (NCCL needs one GPU per rank: give each rank its own device)"
    )
    assert "ranks [[0, 2]] share a GPU" in why_not_nccl(["GPU-a", "GPU-b", "GPU-a"])
    assert why_not_nccl([None, "GPU-a"]) == "rank(s) [0] of 2 compute on the CPU"
    assert why_not_nccl([None, None]) == "rank(s) [0, 1] of 2 compute on the CPU"


def test_a_seat_taken_before_means_an_earlier_groups_store() -> None:
    store = torch.distributed.HashStore()
    assert take_seat(store, _seat_settings(0)) and take_seat(store, _seat_settings(1))
    assert not take_seat(store, _seat_settings(1))  # rank 1 again: its predecessor sat here
    agents = torch.distributed.HashStore()  # torchrun's agent store outlives its rounds: no check
    assert take_seat(agents, _seat_settings(1, agent_store=True)) and take_seat(agents, _seat_settings(1, True))


class _GoneStore:
    """A store whose server (rank 0) has gone: torch raises DistNetworkError, a RuntimeError."""

    def check(self, keys):
        raise torch.distributed.DistNetworkError("Connection reset by peer")


def test_the_group_is_broken_by_a_restarted_rank_or_a_store_gone() -> None:
    store = torch.distributed.HashStore()
    assert group_broken(store, 1) == "" and group_broken(store, 0) == ""
    store.set(REJOINED, "1")
    assert group_broken(store, 0) == "rank 1 restarted and waits for a new group"
    assert group_broken(_GoneStore(), 1) == "rank 0's rendezvous store is gone, rank 0 left (DistNetworkError)"
    assert group_broken(_GoneStore(), 0) == ""  # rank 0 serves the store itself

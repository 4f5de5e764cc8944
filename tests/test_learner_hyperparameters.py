"""UpdateHyperparameters and ListCheckpoints: validation by field, new values from the next update on
(never inside one, never waiting for one), persistence through a checkpoint restart, and the
checkpoint listing. The core and the servicer without sockets, then both RPCs over real gRPC."""

from __future__ import annotations

import asyncio
import math
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from conftest import Aborted, FakeContext
from test_learner_service import ACTION_SPACE, OBS_SPACE, make_arrays

from fast.v1 import learner_pb2 as pb
from learner import checkpoint as checkpoint_module
from learner.batch import RolloutBatch
from learner.checkpoint import describe_checkpoints, load_checkpoint
from learner.client import LearnerClient
from learner.config import LearnerConfig
from learner.core import LearnerCore
from learner.server import create_server
from learner.servicer import LearnerServicer
from learner.wire import Hyperparameters, LearnerStatus

DEFAULT = Hyperparameters(learning_rate=3e-4, ent_coef=0.0)  # LearnerConfig's


def _core(directory: Path, **settings) -> LearnerCore:
    settings = {"checkpoint_dir": directory, "update_epochs": 2, "num_minibatches": 2, **settings}
    return LearnerCore(LearnerConfig(**settings))


def _batch(version: int, seed: int = 0, steps: int = 16) -> RolloutBatch:
    return RolloutBatch.from_numpy({**make_arrays(seed=seed, steps=steps), "policy_version": version})


def optimiser_lrs(core: LearnerCore) -> set[float]:
    return {group["lr"] for group in core._learner.optimizer.param_groups}


def update_request(**fields) -> pb.UpdateHyperparametersRequest:
    return pb.UpdateHyperparametersRequest(**fields)


# -- validation ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, fragments",
    [
        ({"learning_rate": 0.0}, ["learning_rate must be finite, > 0 and <= 1, got 0.0"]),
        ({"learning_rate": -1e-3}, ["learning_rate must be", "got -0.001"]),
        ({"learning_rate": 1.5}, ["learning_rate must be", "<= 1", "got 1.5"]),
        ({"learning_rate": math.nan}, ["learning_rate must be finite", "got nan"]),
        ({"learning_rate": math.inf}, ["learning_rate must be finite", "got inf"]),
        ({"ent_coef": -0.01}, ["ent_coef must be finite, >= 0 and <= 1, got -0.01"]),
        ({"ent_coef": 1.5}, ["ent_coef must be", "got 1.5"]),
        ({"ent_coef": math.nan}, ["ent_coef must be finite", "got nan"]),
        ({"ent_coef": -math.inf}, ["ent_coef must be finite", "got -inf"]),
        ({}, ["sets no field", "learning_rate", "ent_coef"]),
        ({"learning_rate": 2.0, "ent_coef": -1.0}, ["learning_rate must", "got 2.0", "ent_coef must", "got -1.0"]),
        # A valid field beside an invalid one is not applied either.
        ({"learning_rate": 1e-3, "ent_coef": 2.0}, ["ent_coef must be", "nothing was changed"]),
    ],
)
def test_update_hyperparameters_refuses_values_out_of_range_by_field(
    tmp_path: Path, fields: dict, fragments: list[str]
) -> None:
    async def run() -> tuple[Aborted, LearnerStatus]:
        core = _core(tmp_path)
        await core.initialize(OBS_SPACE, ACTION_SPACE)
        servicer = LearnerServicer(core)
        with pytest.raises(Aborted) as excinfo:
            await servicer.UpdateHyperparameters(update_request(**fields), FakeContext())
        return excinfo.value, core.status()

    refused, status = asyncio.run(run())
    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT, refused.details
    for fragment in fragments:
        assert fragment in refused.details, refused.details
    assert status.hyperparameters == DEFAULT


def test_update_hyperparameters_accepts_the_bounds(tmp_path: Path) -> None:
    async def run() -> list[pb.UpdateHyperparametersResponse]:
        servicer = LearnerServicer(_core(tmp_path))
        return [
            await servicer.UpdateHyperparameters(update_request(**fields), FakeContext())
            for fields in ({"learning_rate": 1.0}, {"ent_coef": 0.0}, {"ent_coef": 1.0}, {"learning_rate": 1e-12})
        ]

    replies = asyncio.run(run())
    assert [(r.hyperparameters.learning_rate, r.hyperparameters.ent_coef) for r in replies] == [
        (1.0, 0.0),
        (1.0, 0.0),
        (1.0, 1.0),
        (1e-12, 1.0),
    ]


# -- when they apply -------------------------------------------------------------------------------


def test_new_values_apply_from_the_next_update_as_if_configured(tmp_path: Path) -> None:
    """Changed at version 0, the values train version 1 exactly as a learner configured with them would."""
    changed = Hyperparameters(learning_rate=1e-3, ent_coef=0.05)

    async def run() -> tuple:
        core = _core(tmp_path / "changed")
        await core.initialize(OBS_SPACE, ACTION_SPACE)
        reply = core.update_hyperparameters(learning_rate=1e-3, ent_coef=0.05)
        status = core.status()
        result = await core.submit(_batch(0))
        lrs = optimiser_lrs(core)
        configured = _core(tmp_path / "configured", lr=1e-3, ent_coef=0.05)
        await configured.initialize(OBS_SPACE, ACTION_SPACE)
        unchanged = _core(tmp_path / "unchanged")
        await unchanged.initialize(OBS_SPACE, ACTION_SPACE)
        others = [(await other.submit(_batch(0))).policy.weights for other in (configured, unchanged)]
        return reply, status, lrs, result, others

    reply, status, lrs, result, (configured_weights, unchanged_weights) = asyncio.run(run())
    assert reply == (changed, 1)  # effective from version 1: the current version + 1
    assert status.hyperparameters == changed and lrs == {1e-3}
    assert (result.stats["learning_rate"], result.stats["ent_coef"]) == (1e-3, 0.05)
    assert result.policy.weights == configured_weights  # the optimiser's lr and the loss's ent_coef both changed
    assert result.policy.weights != unchanged_weights


def test_a_change_during_an_update_takes_the_next_one_without_waiting(tmp_path: Path) -> None:
    """Changed while an update trains (held there by a gate): the call answers at once, the update in
    flight keeps the values it started with, and the version after it is the first with the new ones."""
    started, release = threading.Event(), threading.Event()

    async def run() -> tuple:
        core = _core(tmp_path)
        await core.initialize(OBS_SPACE, ACTION_SPACE)
        update = core._learner.update

        def gated_update(batch: RolloutBatch) -> dict[str, float]:
            started.set()
            assert release.wait(timeout=60), "the test never released the update"
            return update(batch)

        core._learner.update = gated_update
        in_flight = asyncio.create_task(core.submit(_batch(0)))
        assert await asyncio.to_thread(started.wait, 60)
        reply = core.update_hyperparameters(learning_rate=2e-3, ent_coef=0.5)  # would deadlock if it waited
        status = core.status()
        release.set()
        first = await in_flight
        second = await core.submit(_batch(1, seed=1))
        return reply, status, first, second

    reply, status, first, second = asyncio.run(run())
    changed = Hyperparameters(2e-3, 0.5)
    assert reply == (changed, 2) and status.hyperparameters == changed  # version 1 was already training
    assert (first.policy_version, first.stats["learning_rate"], first.stats["ent_coef"]) == (1, 3e-4, 0.0)
    assert (second.policy_version, second.stats["learning_rate"], second.stats["ent_coef"]) == (2, 2e-3, 0.5)


def test_values_set_before_initialize_train_the_policy_initialize_builds(tmp_path: Path) -> None:
    async def run() -> tuple:
        core = _core(tmp_path)
        reply = core.update_hyperparameters(learning_rate=5e-4)
        before = (core.initialized, core.status().hyperparameters)
        await core.initialize(OBS_SPACE, ACTION_SPACE)
        lrs = optimiser_lrs(core)
        stats = (await core.submit(_batch(0))).stats
        return reply, before, lrs, stats

    reply, before, lrs, stats = asyncio.run(run())
    expected = Hyperparameters(learning_rate=5e-4, ent_coef=0.0)
    assert reply == (expected, 1) and before == (False, expected) and lrs == {5e-4}
    assert stats["learning_rate"] == 5e-4
    assert load_checkpoint(tmp_path / "ckpt-000000000.pt").hyperparameters == expected  # Initialize's checkpoint


# -- persistence -----------------------------------------------------------------------------------


def test_changed_values_survive_a_checkpoint_restart(tmp_path: Path) -> None:
    async def run() -> tuple:
        first = _core(tmp_path, checkpoint_every=1)
        await first.initialize(OBS_SPACE, ACTION_SPACE)
        first.update_hyperparameters(learning_rate=1e-3, ent_coef=0.1)
        await first.submit(_batch(0))  # checkpoint of version 1

        second = _core(tmp_path, checkpoint_every=1)
        resumed = (second.policy_version, second.status().hyperparameters, optimiser_lrs(second))
        stats = (await second.submit(_batch(1, seed=1))).stats
        # A change with no update after it reaches the disk with the final checkpoint.
        second.update_hyperparameters(ent_coef=0.2)
        final = await second.close()

        third = _core(tmp_path)
        return resumed, stats, final, third.status().hyperparameters, optimiser_lrs(third)

    resumed, stats, final, third_values, third_lrs = asyncio.run(run())
    assert resumed == (1, Hyperparameters(1e-3, 0.1), {1e-3})
    assert (stats["learning_rate"], stats["ent_coef"]) == (1e-3, 0.1)
    assert final is not None and final.name == "ckpt-000000002.pt"
    assert third_values == Hyperparameters(1e-3, 0.2) and third_lrs == {1e-3}


def test_a_setting_changed_in_the_config_since_the_checkpoint_wins(tmp_path: Path) -> None:
    async def run() -> None:
        core = _core(tmp_path)
        await core.initialize(OBS_SPACE, ACTION_SPACE)
        core.update_hyperparameters(learning_rate=1e-3, ent_coef=0.1)
        await core.save_checkpoint()

    asyncio.run(run())
    # The operator restarts with a new --lr: it wins; ent_coef, untouched in the config, resumes as changed.
    restarted = _core(tmp_path, lr=5e-4)
    assert restarted.status().hyperparameters == Hyperparameters(5e-4, 0.1) and optimiser_lrs(restarted) == {5e-4}


def test_a_checkpoint_without_hyperparameters_resumes_with_the_config(tmp_path: Path) -> None:
    asyncio.run(_core(tmp_path, lr=1e-3).initialize(OBS_SPACE, ACTION_SPACE))
    path = tmp_path / "ckpt-000000000.pt"
    payload = torch.load(path, weights_only=True)
    del payload["hyperparameters"]  # as an older learner wrote it
    torch.save(payload, path)
    assert load_checkpoint(path).hyperparameters is None

    restarted = _core(tmp_path, lr=2e-4, ent_coef=0.03)
    assert restarted.status().hyperparameters == Hyperparameters(2e-4, 0.03) and optimiser_lrs(restarted) == {2e-4}
    # Nothing changed since it was restored: stopping writes no checkpoint.
    assert asyncio.run(restarted.close()) is None


# -- ListCheckpoints -------------------------------------------------------------------------------


def test_list_checkpoints_newest_first(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoints"

    async def run() -> tuple:
        core = _core(directory, checkpoint_every=1, keep_checkpoints=3)
        before = await core.list_checkpoints()  # before Initialize, the directory does not exist yet
        await core.initialize(OBS_SPACE, ACTION_SPACE)
        for version in range(3):
            await core.submit(_batch(version, seed=version))
        reply = await LearnerServicer(core).ListCheckpoints(pb.ListCheckpointsRequest(), FakeContext())
        return before, await core.list_checkpoints(), reply

    before, listed, reply = asyncio.run(run())
    assert before == []
    assert [info.policy_version for info in listed] == [3, 2, 1]  # version 0 was pruned (keep 3)
    for info in listed:
        stat = Path(info.path).stat()
        assert Path(info.path).name == f"ckpt-{info.policy_version:09d}.pt"
        assert (info.size_bytes, info.modified_unix) == (stat.st_size, stat.st_mtime) and info.size_bytes > 0
    assert [(c.path, c.policy_version, c.size_bytes) for c in reply.checkpoints] == [
        (info.path, info.policy_version, info.size_bytes) for info in listed
    ]


def test_list_checkpoints_skips_a_file_pruned_while_listing(tmp_path: Path, monkeypatch) -> None:
    asyncio.run(_core(tmp_path).initialize(OBS_SPACE, ACTION_SPACE))
    listed = checkpoint_module.list_checkpoints(tmp_path)
    pruned = (7, tmp_path / "ckpt-000000007.pt")  # listed, then deleted before its stat
    monkeypatch.setattr(checkpoint_module, "list_checkpoints", lambda directory: [*listed, pruned])
    assert [info.policy_version for info in describe_checkpoints(tmp_path)] == [0]
    monkeypatch.undo()
    assert describe_checkpoints(tmp_path / "absent") == []


# -- over gRPC -------------------------------------------------------------------------------------


def test_update_hyperparameters_and_list_checkpoints_over_grpc(tmp_path: Path) -> None:
    async def run() -> None:
        core = _core(tmp_path)
        server, port, _ = await create_server(core, "127.0.0.1:0")
        try:
            async with LearnerClient(f"127.0.0.1:{port}", timeout_s=30) as client:
                await client.wait_ready()
                version, _ = await client.initialize(OBS_SPACE, ACTION_SPACE)
                values, effective_from = await client.update_hyperparameters(learning_rate=1e-3)
                assert values == Hyperparameters(1e-3, 0.0) and effective_from == version + 1
                with pytest.raises(grpc.aio.AioRpcError) as excinfo:
                    await client.update_hyperparameters(ent_coef=-1.0)
                assert excinfo.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "ent_coef must be finite, >= 0 and <= 1, got -1.0" in excinfo.value.details()
                assert (await client.status()).hyperparameters == values

                reply = await client.submit(make_arrays(seed=3), policy_version=version)
                assert (reply.stats["learning_rate"], reply.stats["ent_coef"]) == (1e-3, 0.0)
                assert (await client.status()).last_stats["learning_rate"] == 1e-3

                await client.save_checkpoint()
                listed = await client.list_checkpoints()
                assert [info.policy_version for info in listed] == [version + 1, version]
                assert np.all([Path(info.path).is_file() for info in listed])
        finally:
            await server.stop(None)

    asyncio.run(run())

"""Data-parallel SMPO (learner/distributed.py): R ranks' update equals one learner's on the union.

Two real ranks, each a process joined by torch.distributed over gloo on loopback (the rendezvous a
TCPStore on 127.0.0.1 whose port is picked by binding 0), each given its own padded batch (other
shapes, other padding); their weights after two updates are held to one learner's after the same
two updates on the union of the batches (slots concatenated in rank order). Garbage in either
rank's padding changes nothing, bit for bit.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import queue
import time
from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist
from test_ppo import OBS_DIM, padded_batch

from learner.batch import RolloutBatch
from learner.distributed import RankRefused, Ranks, RankShare
from learner.group import rendezvous_store
from learner.policy import ActionSpec, ActorCritic
from learner.ppo import PPOConfig, PPOLearner

WORLD_SIZE = 2
RANK_TIMEOUT_S = 60  # a rank that waits this long for the other fails instead of hanging
_TENSOR_FIELDS = ("obs", "actions", "logprobs", "values", "rewards", "terminated", "truncated", "bootstrap_values")
_BASE = PPOConfig(update_epochs=3, num_minibatches=4, lr=1e-2, ent_coef=0.01, seed=3)

# name -> (action kind, dtype, config, obs_norm, per-rank (steps, slots, valid steps per slot), per-rank
# padding garbage). Each rank has other T, N and padding positions. In `sparse64` rank 1 holds 2 of the
# 97 transitions, so most of its shares of the 8 minibatches are empty: it joins them with no entry.
CASES: dict[str, tuple] = {
    "box64": ("box", "float64", replace(_BASE, norm_reward=True), True, [(29, 5, 19), (23, 3, 11)], [math.nan] * 2),
    "box64_other_garbage": (
        "box",
        "float64",
        replace(_BASE, norm_reward=True),
        True,
        [(29, 5, 19), (23, 3, 11)],
        [1e9, -math.inf],
    ),
    "box32": ("box", "float32", replace(_BASE, norm_reward=True), True, [(29, 5, 19), (23, 3, 11)], [math.nan, 1e9]),
    "discrete64": (
        "discrete",
        "float64",
        replace(_BASE, update_epochs=2, num_minibatches=3, seed=5, clip_vloss=True),
        False,
        [(17, 4, 9), (31, 6, 20)],
        [math.nan, 1e9],
    ),
    "sparse64": ("box", "float64", replace(_BASE, num_minibatches=8), False, [(29, 5, 19), (6, 2, 1)], [math.nan] * 2),
}
STAT_KEYS = ("policy_loss", "value_loss", "entropy", "approx_kl", "explained_variance", "reward_scale", "num_valid")


def _policy(kind: str, dtype: str, obs_norm: bool) -> ActorCritic:
    torch.manual_seed(0)
    spec = ActionSpec.box(2) if kind == "box" else ActionSpec.discrete(3)
    return ActorCritic(OBS_DIM, spec, obs_norm=obs_norm).to(getattr(torch, dtype))


def _rank_batches(case: str, update: int) -> list[RolloutBatch]:
    """Each rank's batch for one of the two updates: shapes, padding and garbage of its own."""
    kind, _, _, _, shapes, garbage = CASES[case]
    return [
        padded_batch(kind, steps, slots, valid, seed=100 * update + 10 * rank + 1, garbage=garbage[rank])
        for rank, (steps, slots, valid) in enumerate(shapes)
    ]


def union(batches: list[RolloutBatch]) -> RolloutBatch:
    """One batch holding every rank's slots in rank order, a shorter T padded at its end (with NaN)."""
    num_steps = max(batch.num_steps for batch in batches)

    def padded(tensor: torch.Tensor) -> torch.Tensor:
        rows = num_steps - tensor.shape[0]
        fill = math.nan if tensor.is_floating_point() else 0
        return torch.cat([tensor, torch.full((rows, *tensor.shape[1:]), fill, dtype=tensor.dtype)])

    fields = {name: torch.cat([padded(getattr(b, name)) for b in batches], dim=1) for name in _TENSOR_FIELDS}
    valid_mask = torch.cat([padded(b.valid_mask) for b in batches], dim=1)
    return RolloutBatch(**fields, valid_mask=valid_mask, policy_version=batches[0].policy_version)


def _state(learner: PPOLearner) -> dict[str, np.ndarray]:
    """Weights and normaliser buffers (the policy's state dict) and the reward scale's statistics."""
    state = {name: t.detach().cpu().numpy().copy() for name, t in learner.policy.state_dict().items()}
    if learner.reward_scaler is not None:
        returns = learner.reward_scaler.returns
        state["reward_scaler.mean"], state["reward_scaler.var"] = returns.mean.numpy(), returns.var.numpy()
    return state


def _train(case: str, ranks: Ranks | None, rank: int | None) -> tuple[dict[str, np.ndarray], list[dict]]:
    """Two updates of a fresh learner: on this rank's batches with `ranks`, on their union without."""
    kind, dtype, config, obs_norm, _, _ = CASES[case]
    learner = PPOLearner(_policy(kind, dtype, obs_norm), config, device="cpu")
    stats = []
    for update in range(2):
        batches = _rank_batches(case, update)
        stats.append(learner.update(union(batches)) if ranks is None else learner.update(batches[rank], ranks))
    return _state(learner), stats


def _rank_main(rank: int, store_port: int, results: multiprocessing.Queue) -> None:
    """One rank (a spawned process): join the group, train every case, send the results back."""
    torch.set_num_threads(1)
    try:
        store = rendezvous_store("127.0.0.1", store_port, is_master=False, timeout_s=RANK_TIMEOUT_S)
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=RANK_TIMEOUT_S)
        )
        ranks = Ranks()
        out = {case: _train(case, ranks, rank) for case in CASES}
        # A refused batch on one rank is refused on every rank, and nothing is updated anywhere.
        learner = PPOLearner(_policy("box", "float64", False), replace(_BASE, seed=1), device="cpu")
        before = _state(learner)
        batch = _rank_batches("box64", 0)[rank]
        if rank == 1:
            batch = replace(batch, logprobs=torch.full_like(batch.logprobs, math.nan))  # non-finite where read
        try:
            learner.update(batch, ranks)
            refusal = "updated"
        except RankRefused as error:
            refusal = f"RankRefused: {error}"
        except ValueError as error:
            refusal = f"ValueError: {error}"
        unchanged = all(np.array_equal(before[k], v) for k, v in _state(learner).items())
        results.put((rank, out, refusal, unchanged))
    except BaseException as error:  # the parent reports it instead of waiting for a result
        results.put((rank, None, f"{type(error).__name__}: {error}", False))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def rank_results() -> dict[int, tuple]:
    """Both ranks' results; every process started here is stopped before the tests read them."""
    interface = os.environ.get("GLOO_SOCKET_IFNAME")
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # rank-to-rank pairs on loopback (the ranks inherit it)
    store = rendezvous_store("127.0.0.1", 0, is_master=True, timeout_s=RANK_TIMEOUT_S)  # bound to loopback alone
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=_rank_main, args=(rank, store.port, results), daemon=True) for rank in range(2)]
    started = time.monotonic()
    try:
        for process in processes:
            process.start()
        gathered = {}
        while len(gathered) < WORLD_SIZE:
            left = 2 * RANK_TIMEOUT_S - (time.monotonic() - started)
            try:
                rank, *rest = results.get(timeout=max(left, 0.1))
            except queue.Empty:
                pytest.fail(f"the ranks sent {len(gathered)} of {WORLD_SIZE} results in {2 * RANK_TIMEOUT_S} s")
            gathered[rank] = tuple(rest)
        for process in processes:
            process.join(timeout=RANK_TIMEOUT_S)
        print(f"\n2 gloo ranks: {time.monotonic() - started:.1f} s for {len(CASES)} cases (spawn included)")
        return gathered
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
            process.join(timeout=5)
        del store
        if interface is None:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
        else:
            os.environ["GLOO_SOCKET_IFNAME"] = interface


def _max_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))) for k in a)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", sorted(CASES))
def test_two_ranks_update_like_one_learner_on_the_union(case: str, rank_results: dict[int, tuple]) -> None:
    for rank in range(WORLD_SIZE):
        assert rank_results[rank][0] is not None, f"rank {rank} failed: {rank_results[rank][1]}"
    (state_0, stats_0), (state_1, stats_1) = rank_results[0][0][case], rank_results[1][0][case]
    # Every rank took the same steps: the same bits on both, and the same statistics.
    assert [{k: s[k] for k in STAT_KEYS} for s in stats_0] == [{k: s[k] for k in STAT_KEYS} for s in stats_1]
    assert _max_difference(state_0, state_1) == 0.0
    expected_state, expected_stats = _train(case, None, None)
    difference = _max_difference(state_0, expected_state)
    tolerance = 1e-6 if CASES[case][1] == "float64" else 1e-5
    print(f"\n{case}: max |w_ranks - w_union| = {difference:.3g} (tolerance {tolerance:g})")
    assert difference <= tolerance
    for got, want in zip(stats_0, expected_stats):
        assert got["num_valid"] == want["num_valid"]
        for key in STAT_KEYS:
            assert got[key] == pytest.approx(want[key], rel=tolerance, abs=tolerance), key


@pytest.mark.timeout(150)
def test_garbage_in_any_ranks_padding_changes_nothing(rank_results: dict[int, tuple]) -> None:
    for rank in range(WORLD_SIZE):
        assert rank_results[rank][0] is not None, f"rank {rank} failed: {rank_results[rank][1]}"
        nan_state, _ = rank_results[rank][0]["box64"]
        other_state, _ = rank_results[rank][0]["box64_other_garbage"]
        assert _max_difference(nan_state, other_state) == 0.0


@pytest.mark.timeout(150)
def test_a_batch_refused_on_one_rank_is_refused_on_every_rank(rank_results: dict[int, tuple]) -> None:
    _, refusal_0, unchanged_0 = rank_results[0]
    _, refusal_1, unchanged_1 = rank_results[1]
    assert (
        refusal_0
        == f"RankRefused: rank(s) [1] of {WORLD_SIZE} refused their batch for this update; no rank was updated"
    )
    assert refusal_1.startswith("ValueError: RolloutBatch.logprobs"), refusal_1
    assert unchanged_0 and unchanged_1


@pytest.mark.parametrize("counts", [(5,), (7, 3), (1, 0, 4), (0, 9, 2, 6)])
@pytest.mark.parametrize("num_minibatches", [1, 3, 8])
def test_rank_shares_of_each_minibatch_are_exactly_one_learners_minibatch(
    counts: tuple[int, ...], num_minibatches: int
) -> None:
    """The shares of part k over the ranks, put back in the global index space, are part k, in order."""
    total = sum(counts)
    shares = [RankShare(rank, sum(counts[:rank]), n, total) for rank, n in enumerate(counts)]
    permutation = torch.randperm(total, generator=torch.Generator().manual_seed(total))
    for part in torch.tensor_split(permutation, num_minibatches):
        pieces = [share.local(part) + share.offset for share in shares]
        for share, local in zip(shares, [share.local(part) for share in shares]):
            assert bool(((local >= 0) & (local < share.num_valid)).all())
        assert sorted(torch.cat(pieces).tolist()) == sorted(part.tolist())
        owner = {int(index): rank for rank, piece in enumerate(pieces) for index in piece}
        for rank, piece in enumerate(pieces):  # each rank keeps the part's order
            assert piece.tolist() == [int(i) for i in part if owner[int(i)] == rank]


@pytest.mark.timeout(60)
def test_one_rank_group_updates_like_the_single_learner() -> None:
    """World size 1 through the rank path (a HashStore: no socket) gives the single learner's figures."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ranks = Ranks()
        for case in ("box64", "discrete64"):
            kind, dtype, config, obs_norm, shapes, garbage = CASES[case]
            alone = PPOLearner(_policy(kind, dtype, obs_norm), config, device="cpu")
            grouped = PPOLearner(_policy(kind, dtype, obs_norm), config, device="cpu")
            for update in range(2):
                batch = _rank_batches(case, update)[0]
                want, got = alone.update(batch), grouped.update(batch, ranks)
                assert {k: got[k] for k in STAT_KEYS} == pytest.approx({k: want[k] for k in STAT_KEYS}, abs=1e-12)
            assert _max_difference(_state(alone), _state(grouped)) <= 1e-12
    finally:
        dist.destroy_process_group()

"""DPSA's `carry` truncation: a round's end closes the batch's tensors but not the live episodes.

- Against a slow reference: the batches of several carry rounds and iterations equal, array for
  array, what a plain loop over the same scripted trajectories builds (every step of every slot
  written out, no sampler code shared).
- Pipelined on servers of different speeds: every transition is on-policy, every slot's steps
  continue its episode across round and iteration boundaries, and no episode is cut.
- A deterministic policy on the takeover workload: carry plays each dealt clip's episode to the
  same end as SC (same clip, same seed, same actions), so its episode lengths are SC's.
"""

from __future__ import annotations

import asyncio
from contextlib import ExitStack

import numpy as np
import pytest
import torch
from conftest import sim_server
from scripted_env import ScriptedLengthEnv
from test_broker_samplers import _check_batch, scripted_pool
from test_pipelined_rounds import _scripted_servers
from test_prefetch_system import COSTS, sample_three

from broker.dealer import ClipDealer
from broker.metrics import IterationStats
from broker.policy_runner import PolicyRunner
from broker.pool import SimulatorPool
from broker.samplers import make_sampler

LENGTHS = [2, 5, 9, 20, 3, 7]  # per slot; slot 4's episodes end by their clip's end (truncated)
TRUNCATING = (4,)


def reference_batches(
    lengths: list[int], truncating: tuple[int, ...], *, alpha: float, t_max: int, samples: int, iterations: int
) -> list[dict[str, np.ndarray]]:
    """DPSA with carry written out step by step for ScriptedLengthEnv on one server: the
    observation is [steps taken, slot, clip]; bootstrap observations are kept as such."""
    n = len(lengths)
    dealer = ClipDealer(50, holdout_every=0, seed=0)
    live, t, clip = [False] * n, [0] * n, [0] * n
    batches = []
    for _ in range(iterations):
        rows: list[list[dict | None]] = []
        valid = 0
        while True:
            fresh = [s for s in range(n) if not live[s]]
            if fresh:  # the round's batched reset: only the slots without a live episode
                clips, _ = dealer.deal(len(fresh))
                for s, c in zip(fresh, clips):
                    live[s], t[s], clip[s] = True, 0, int(c)
            done, steps = [False] * n, 0
            while True:
                row: list[dict | None] = [None] * n
                for s in range(n):
                    if not live[s]:
                        continue  # padding
                    step = {"obs": (t[s], s, clip[s])}
                    t[s] += 1
                    ended = t[s] >= lengths[s]
                    step["terminated"] = ended and s not in truncating
                    step["truncated"] = ended and s in truncating
                    step["next_obs"] = (t[s], s, clip[s])
                    row[s] = step
                    valid += 1
                    if ended:
                        live[s], done[s] = False, True
                rows.append(row)
                steps += 1
                if sum(done) / n >= alpha or steps >= t_max:
                    break
            for s in range(n):  # global truncation: live episodes are bootstrapped and go on
                if live[s]:
                    rows[-1][s]["truncated"] = True
            if valid >= samples:
                break
        batches.append(_arrays(rows, n))
    return batches


def _arrays(rows: list[list[dict | None]], n: int) -> dict[str, np.ndarray]:
    shape = (len(rows), n)
    out = {
        "obs": np.zeros((*shape, 3), np.float32),
        "rewards": np.zeros(shape, np.float32),
        "terminated": np.zeros(shape, bool),
        "truncated": np.zeros(shape, bool),
        "valid_mask": np.zeros(shape, bool),
        "bootstrap_obs": np.full((*shape, 3), np.nan, np.float32),
    }
    for i, row in enumerate(rows):
        for s, step in enumerate(row):
            if step is None:
                continue
            out["obs"][i, s] = step["obs"]
            out["rewards"][i, s] = 1.0
            out["valid_mask"][i, s] = True
            out["terminated"][i, s] = step["terminated"]
            out["truncated"][i, s] = step["truncated"]
            if step["truncated"]:
                out["bootstrap_obs"][i, s] = step["next_obs"]
    return out


def _on_policy(runner: PolicyRunner, batch: dict) -> None:
    """Every valid transition's log-prob and value are the policy's for its observation and action."""
    valid = batch["valid_mask"]
    obs = torch.as_tensor(batch["obs"][valid])
    with torch.no_grad():
        _, logprob, _, value = runner.policy.get_action_and_value(obs, torch.as_tensor(batch["actions"][valid]))
    np.testing.assert_allclose(batch["logprobs"][valid], logprob.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(batch["values"][valid], value.numpy(), rtol=1e-4, atol=1e-5)


def test_carry_batches_equal_a_slow_reference_over_rounds_and_iterations() -> None:
    async def go():
        env = ScriptedLengthEnv(LENGTHS, truncating=TRUNCATING)
        async with scripted_pool(env) as (pool, runner):
            sampler = make_sampler(
                "fast",
                pool,
                runner,
                ClipDealer(50, holdout_every=0, seed=0),
                samples_per_iteration=40,
                alpha=0.5,
                t_max=6,
                truncation="carry",
            )
            return runner, [await sampler.sample() for _ in range(3)]

    runner, out = asyncio.run(go())
    expected = reference_batches(LENGTHS, TRUNCATING, alpha=0.5, t_max=6, samples=40, iterations=3)
    for (batch, stats), ref in zip(out, expected):
        _check_batch(batch)
        _on_policy(runner, batch)
        for key in ("obs", "rewards", "terminated", "truncated", "valid_mask"):
            np.testing.assert_array_equal(batch[key], ref[key], err_msg=key)
        at = ref["truncated"]
        np.testing.assert_allclose(batch["bootstrap_values"][at], runner.value(ref["bootstrap_obs"][at]), rtol=1e-5)
        assert (batch["bootstrap_values"][~at] == 0).all()
        assert "cut" not in stats.episode_ends  # nothing is cut: episodes end only where their clip ends them
        # An episode that ended is as long as the script makes it, wherever rounds began and ended.
        ended = [LENGTHS[s] for r, s in zip(*np.nonzero(batch["terminated"] | (ref["truncated"] & _env_end(ref))))]
        assert sorted(stats.episode_lengths) == sorted(ended)


def _env_end(ref: dict) -> np.ndarray:
    """Truncations that are the clip's own end (slot 4 at its length), not a round's end."""
    steps_after = ref["obs"][..., 0] + 1
    return steps_after == np.array(LENGTHS)[None, :]


@pytest.mark.timeout(90)
def test_pipelined_carry_keeps_steps_past_the_end_and_continues_every_episode() -> None:
    async def go():
        async with _scripted_servers(
            (ScriptedLengthEnv([2, 9, 30]), 0.0005),
            (ScriptedLengthEnv([4, 6, 11]), 0.002),
            (ScriptedLengthEnv([3, 8, 25]), 0.004),
        ) as pool:
            runner = PolicyRunner(pool.observation_space, pool.action_space, (8,), seed=0)
            sampler = make_sampler(
                "fast",
                pool,
                runner,
                ClipDealer(pool.num_clips, holdout_every=0, seed=0),
                samples_per_iteration=60,
                alpha=0.4,
                t_max=8,
                truncation="carry",
                pipeline=True,
            )
            lengths = np.array([2, 9, 30, 4, 6, 11, 3, 8, 25])
            return runner, lengths, [await sampler.sample() for _ in range(3)]

    runner, lengths, out = asyncio.run(go())
    last_t = np.full(lengths.size, -1.0)  # each slot's steps taken at its last valid transition so far
    for batch, stats in out:
        _check_batch(batch)
        _on_policy(runner, batch)
        assert "cut" not in stats.episode_ends and stats.steps_discarded == 0
        steps_taken = batch["obs"][..., 0]
        for s in range(lengths.size):
            for row in np.flatnonzero(batch["valid_mask"][:, s]):
                t = steps_taken[row, s]
                # The episode goes on from where the slot's last step left it, or it started over
                # because that step ended it: never from anywhere else.
                assert t == last_t[s] + 1 or (t == 0 and (last_t[s] < 0 or last_t[s] + 1 == lengths[s])), (s, row)
                last_t[s] = t
        assert sorted(stats.episode_lengths) == sorted(int(lengths[s]) for s in np.nonzero(batch["terminated"])[1])
    # The servers did step past rounds' ends, and those steps were kept, not thrown away.
    assert sum(stats.steps_ahead for _, stats in out) > 0


async def _episodes(addresses: list[str], mode: str, samples: int, slots: int) -> list[tuple[int, int, float]]:
    """(clip, length, return) of every episode `mode` finishes on the takeover servers at
    `addresses` with the policy's mean action (a deterministic policy), in `samples` valid steps."""
    ended: list[tuple[int, int, float]] = []
    record = IterationStats.record_episode

    def keep(stats, length, cause, summary=None):
        if summary is not None:
            ended.append((int(summary.metrics["clip_id"]), int(length), round(float(summary.episode_return), 4)))
        record(stats, length, cause, summary)

    pool = SimulatorPool()
    try:
        for address in addresses:
            await pool.add(address)
        runner = PolicyRunner(pool.observation_space, pool.action_space, (16,), seed=3)
        with torch.no_grad():  # std 1e-13: every action is the mean, whatever the noise
            runner.policy.actor_logstd.fill_(-30.0)
        runner.load(0, _weights(runner))
        dealer = ClipDealer(pool.num_clips, holdout_every=10, seed=5)
        sampler = make_sampler(
            mode, pool, runner, dealer, samples_per_iteration=samples, alpha=0.5, t_max=40, truncation="carry",
            slots=np.arange(slots),
        )  # fmt: skip
        IterationStats.record_episode = keep
        try:
            for _ in range(2):
                await sampler.sample()
        finally:
            IterationStats.record_episode = record
        return ended
    finally:
        await pool.close()


def _weights(runner: PolicyRunner) -> bytes:
    from learner.policy import export_weights

    return export_weights(runner.policy)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_carry_plays_every_episode_as_sc_does_under_a_deterministic_policy() -> None:
    with ExitStack() as stack:
        servers = [stack.enter_context(sim_server("--slots", "4")) for _ in range(2)]
        addresses = [s.address for s in servers]
        sc = asyncio.run(_episodes(addresses, "sc", 1500, 1))
        carry = asyncio.run(_episodes(addresses, "fast", 1500, 8))
    # Clips are dealt in one order whatever the grouping (the k-th dealt episode has the same clip
    # and seed), and within the catalog's first pass no clip is dealt twice.
    sc_by_clip = {clip: (length, ret) for clip, length, ret in sc}
    carry_by_clip = {clip: (length, ret) for clip, length, ret in carry}
    assert len(sc_by_clip) == len(sc) and len(carry_by_clip) == len(carry)
    common = sorted(set(sc_by_clip) & set(carry_by_clip))
    assert len(common) >= 10, (len(sc), len(carry))
    for clip in common:
        assert carry_by_clip[clip] == sc_by_clip[clip], clip
    # t_max = 40 cut rounds while some episodes ran longer: those were carried, not cut.
    assert max(length for length, _ in (carry_by_clip[c] for c in common)) > 40


@pytest.mark.timeout(120)
def test_carry_with_prefetch_resets_ended_slots_onto_clips_loaded_while_they_ran() -> None:
    with ExitStack() as stack:
        servers = [stack.enter_context(sim_server("--slots", "3", *COSTS)) for _ in range(2)]
        batches, stats, pool = asyncio.run(
            sample_three([s.address for s in servers], prefetch=True, truncation="carry")
        )
    for batch, s in zip(batches, stats):
        _check_batch(batch)
        assert "cut" not in s.episode_ends and s.valid >= 400
    # Every reset after the first round's took a clip prepared ahead (each slot's next clip is dealt
    # and loaded right after its own reset), and only ended slots were reset.
    assert pool.counters.prepared > 0
    assert pool.counters.prepared >= pool.counters.reset_slots - 6
    ended = sum(sum(s.episode_ends.values()) for s in stats)
    assert pool.counters.reset_slots <= 6 + ended

"""benchmarks/chaos.py and its parts: their checks on hand-made answers and batches, then a tiny whole run."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from benchmarks.chaos import main_async
from benchmarks.chaos_plan import ChaosConfig, make_plan
from benchmarks.chaos_proxies import CORRUPTION_FIELD, CORRUPTIONS, LearnerProxy, Ledger, SimulatorProxy
from broker import answers
from fast import tensor
from fast.spaces import SpaceSpec
from fast.v1 import learner_pb2
from fast.v1 import simulator_pb2 as pb
from learner.wire import batch_to_proto
from sim_server.client import step_reply

SPACE = SpaceSpec(kind="box", shape=(3,), dtype=np.dtype(np.float32), low=np.full(3, -10.0), high=np.full(3, 10.0))


def _answer(slots: list[int], obs: np.ndarray, rewards: np.ndarray) -> pb.StepResponse:
    k = len(slots)
    return pb.StepResponse(
        slot_ids=slots,
        observations=tensor.to_proto(obs.astype(np.float32)),
        rewards=tensor.to_proto(rewards.astype(np.float32)),
        terminated=tensor.to_proto(np.zeros(k, dtype=bool)),
        truncated=tensor.to_proto(np.zeros(k, dtype=bool)),
        timing=pb.ServerTiming(),
    )


def _proxy(ledger, *, garbage: bool) -> SimulatorProxy:
    proxy = SimulatorProxy(0, "127.0.0.1:1", ledger, seed=0, max_streak=4)
    if garbage:
        proxy.start_garbage(60.0, 1.0)
    return proxy


def test_every_corruption_is_a_bad_answer_the_broker_names_by_field() -> None:
    ledger = Ledger()
    proxy = _proxy(ledger, garbage=True)
    asked = np.array([0, 1])
    for kind in CORRUPTIONS:
        proxy.streak = 0
        bad = proxy._answer(_answer([0, 1], np.ones((2, 3)), np.array([1.0, 2.0])))
        assert ledger.corrupted[-1]["kind"] == kind
        problem = answers.step_problem(step_reply(bad), asked, SPACE)
        assert problem.startswith(CORRUPTION_FIELD[kind] + ":"), problem
    # The real steps behind corrupted answers are spoiled, never produced; their slots forget what they held.
    assert len(ledger.spoiled) > 0 and not ledger.produced and proxy.before == {0: None, 1: None}


def test_garbage_never_runs_to_the_streak_that_would_drop_the_simulator() -> None:
    ledger = Ledger()
    proxy = _proxy(ledger, garbage=True)
    for _ in range(10):
        proxy._answer(_answer([0], np.ones((1, 3)), np.array([0.0])))
    assert len(ledger.corrupted) == 8 and len(ledger.good_steps[0]) == 2  # 4 bad, 1 good, 4 bad, 1 good


def _batch(obs: np.ndarray, rewards: np.ndarray, valid: np.ndarray) -> bytes:
    t, n = valid.shape
    arrays = {
        "obs": obs.astype(np.float32),
        "actions": np.zeros((t, n, 1), dtype=np.float32),
        "logprobs": np.zeros((t, n), dtype=np.float32),
        "values": np.zeros((t, n), dtype=np.float32),
        "rewards": rewards.astype(np.float32),
        "terminated": np.zeros((t, n), dtype=bool),
        "truncated": np.zeros((t, n), dtype=bool),
        "valid_mask": valid,
        "bootstrap_values": np.zeros((t, n), dtype=np.float32),
    }
    return learner_pb2.SubmitBatchRequest(batch=batch_to_proto(arrays, 0)).SerializeToString()


def test_a_valid_transition_the_simulators_did_not_produce_is_counted_as_corruption() -> None:
    ledger = Ledger()
    sim = _proxy(ledger, garbage=False)
    first, second = np.array([[0.0, 1.0, 2.0]]), np.array([[3.0, 4.0, 5.0]])
    sim.before[0] = first.astype(np.float32)[0].tobytes()  # what a Reset delivered
    sim._answer(_answer([0], second, np.array([0.5])))
    sim._answer(_answer([0], first, np.array([0.25])))
    learner = LearnerProxy("127.0.0.1:1", ledger)

    obs = np.stack([first, second])  # [T=2, N=1, 3]: the slot's observation before each step
    valid = np.ones((2, 1), dtype=bool)
    good = learner._check(_batch(obs, np.array([[0.5], [0.25]]), valid))
    assert (good["valid"], good["unknown"], good["spoiled"], good["nonfinite"]) == (2, 0, 0, 0)

    swapped = learner._check(_batch(obs, np.array([[0.25], [0.5]]), valid))  # rewards of the wrong steps
    assert swapped["unknown"] == 2
    nan = learner._check(_batch(obs, np.array([[np.nan], [0.25]]), valid))
    assert nan["unknown"] == 1 and nan["nonfinite"] == 1
    masked = learner._check(_batch(obs, np.array([[np.nan], [0.25]]), np.array([[False], [True]])))
    assert (masked["valid"], masked["unknown"], masked["nonfinite"]) == (1, 0, 0)  # padding is not checked


def test_the_fault_plan_is_seeded_and_inside_the_run() -> None:
    cfg = ChaosConfig(iterations=40, kills=10, stops=3)
    plan = make_plan(cfg)
    assert plan == make_plan(cfg) and plan != make_plan(ChaosConfig(iterations=40, seed=1))
    kinds = [f.kind for f in plan]
    assert [kinds.count(k) for k in ("sim-kill", "sim-stop", "garbage", "learner-kill")] == [10, 3, 1, 1]
    assert all(1 <= f.at_iteration <= cfg.iterations - 3 for f in plan)
    longest = max(cfg.step_timeout_s, cfg.reset_timeout_s)  # a stop outlasts every call in flight
    assert all(longest * 1.2 <= f.duration_s <= longest * 2 for f in plan if f.kind == "sim-stop")


@pytest.mark.slow
@pytest.mark.chaos
@pytest.mark.timeout(240)
def test_a_tiny_chaos_run_loses_duplicates_and_corrupts_nothing() -> None:
    cfg = ChaosConfig(
        iterations=8,
        servers=2,
        kills=2,
        stops=1,
        garbage_s=2.0,
        garbage_rate=1.0,
        learner_kills=1,
        baseline=False,
        run_timeout_s=150.0,
    )
    result = asyncio.run(main_async(cfg, None, "test", lambda message: None))
    run = result["runs"]["chaos"]
    detail = {k: run[k] for k in ("verdict", "batches", "corruption", "versions", "progress", "broker_tail")}
    assert run["completed"] and run["broker_exit_code"] == 0, detail
    assert run["faults_injected"] == {"sim-kill": 2, "sim-stop": 1, "garbage": 1, "learner-kill": 1}, detail
    assert run["corruption"]["valid_transitions_checked"] >= 8 * cfg.samples
    targets = ("no corrupted transition", "no lost batch", "no duplicated or skipped version", "no hang")
    for name in (*targets, "every process stopped at the end"):
        assert run["verdict"][name], (name, detail)
    assert run["garbage"]["corrupted_answers"] > 0
    assert run["verdict"]["every garbage answer faulted by field"], run["garbage"]
    assert run["learner_restarts"] == 1

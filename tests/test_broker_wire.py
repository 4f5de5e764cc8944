"""The broker's plain modules behind its status API, without sockets: the metrics dict <->
IterationMetrics (broker/wire.py), the cumulative histograms, the settings' bounds and the
metrics history that GetMetricsHistory and WatchMetrics serve."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from broker.histogram import EPISODE_LENGTH_BOUNDS, CumulativeHistogram
from broker.history import MetricsHistory
from broker.metrics import IterationStats
from broker.settings import RunSettings, SettingError, changes, learner_changes
from broker.wire import metrics_from_proto, metrics_to_proto
from fast.v1 import broker_pb2 as pb
from fast.v1 import simulator_pb2


def _metrics(iteration: int = 3, *, episodes: bool = True) -> dict:
    """A metrics line as BrokerRun builds it, through the same summary and a JSON round trip."""
    stats = IterationStats("fast", 4, wall_s=0.5, inference_s=0.1, step_wall_s=0.3, step_server_s=0.2)
    stats.reset_wall_s, stats.transitions, stats.valid, stats.global_resets, stats.faults = 0.05, 40, 30, 2, 1
    stats.steps_ahead, stats.steps_discarded = 5, 2  # pipelined rounds' speculative steps
    if episodes:
        summary = simulator_pb2.EpisodeSummary(episode_return=12.5, metrics={"collisions": 1.0, "length": 7})
        stats.record_episode(7, "terminated", summary)
        stats.record_episode(3, "cut")
        stats.record_episode(2, "fault")
    metrics = {
        "iteration": iteration,
        "policy_version": iteration - 1,
        "time": 1700000000.25,
        "iteration_time_s": 0.75,
        **stats.summary(),
        "learner": {"policy_loss": 0.5, "explained_variance": None, "num_valid": 30, "num_total": 40},
        "settings": {
            "alpha": 0.5,
            "t_max": 200,
            "samples_per_iteration": 64,
            "alpha_auto": False,
            "mode": "fast",
            "mode_auto": True,
        },
    }
    if iteration == 3:
        metrics["settings_changed"] = [
            {"name": "alpha", "old_value": 0.5, "new_value": 1.0},
            {"name": "mode", "old_value": "ver", "new_value": "fast"},  # a word: SettingChange's text fields
        ]
    return json.loads(json.dumps(metrics))


def _same(a, b) -> bool:
    """Equal, with NaN equal to NaN."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _learner_complete(learner: dict) -> dict:
    """The learner dict as it comes back: every UpdateStats field, the unset ones 0."""
    names = ["value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm", "update_time_s"]
    hyperparameters = ["learning_rate", "ent_coef", "reward_scale", "lr_anneal_factor"]
    return {**dict.fromkeys([*names, *hyperparameters], 0.0), **learner}


@pytest.mark.parametrize("episodes", [True, False])
def test_metrics_round_trip_through_iteration_metrics(episodes: bool) -> None:
    metrics = _metrics(episodes=episodes)
    message = metrics_to_proto(metrics)
    back = metrics_from_proto(pb.IterationMetrics.FromString(message.SerializeToString()))
    expected = {**metrics, "learner": _learner_complete(metrics["learner"])}
    assert _same(back, expected), (back, expected)
    if episodes:
        assert message.episode_length_mean == pytest.approx(4.0) and list(message.episode_returns) == [12.5]
        assert dict(message.closed_loop) == {"collisions": 1.0} and message.episode_ends.fault == 1
    else:  # NaN means: unset on the wire
        assert not message.HasField("episode_length_mean") and not message.HasField("episode_return_mean")
    assert math.isnan(message.learner.explained_variance)  # None in the dict: NaN on the wire
    assert message.settings == pb.RunSettings(
        alpha=0.5, t_max=200, samples_per_iteration=64, mode="fast", mode_auto=True
    )
    assert [(c.name, c.old_value, c.new_value, c.old_text, c.new_text) for c in message.settings_changed] == [
        ("alpha", 0.5, 1.0, "", ""),
        ("mode", 0.0, 0.0, "ver", "fast"),
    ]
    assert (message.steps_ahead, message.steps_discarded) == (5, 2)


def test_learner_hyperparameters_travel() -> None:
    metrics = {**_metrics(4), "learner": {"policy_loss": 0.1, "learning_rate": 3e-4, "ent_coef": 0.0}}
    back = metrics_from_proto(metrics_to_proto(metrics))["learner"]
    assert back["learning_rate"] == 3e-4 and back["ent_coef"] == 0.0


def test_cumulative_histogram_counts_observations_at_or_below_each_bound() -> None:
    h = CumulativeHistogram([0, 10, 100])
    h.observe([-5, 0, 0.5, 10, 11, 100, 1000, float("nan")])
    assert h.upper_bounds == (0.0, 10.0, 100.0)
    assert h.cumulative_counts == [2, 4, 6, 7]  # <=0: -5, 0; <=10: +0.5, 10; <=100: +11, 100; +inf: +1000
    assert h.count == 7 and h.sum == pytest.approx(1116.5)
    h.observe([])
    assert h.cumulative_counts[-1] == 7
    lengths = CumulativeHistogram(EPISODE_LENGTH_BOUNDS)
    assert lengths.cumulative_counts == [0] * (len(EPISODE_LENGTH_BOUNDS) + 1)
    with pytest.raises(ValueError, match="increasing"):
        CumulativeHistogram([1, 1])


@pytest.mark.parametrize(
    "given, fragment",
    [
        ({"alpha": 0.0}, "alpha is 0.0; allowed: 0 < alpha <= 1"),
        ({"alpha": 1.5}, "alpha is 1.5"),
        ({"alpha": math.nan}, "alpha is nan"),
        ({"t_max": 0}, "t_max is 0; allowed: an integer in 1..100,000"),
        ({"t_max": 100_001}, "t_max is 100001"),
        ({"samples_per_iteration": 0}, "samples_per_iteration is 0; allowed: an integer in 1..10,000,000"),
        ({"samples_per_iteration": 10**19}, "samples_per_iteration is 10000000000000000000"),
        ({}, "no setting given"),
    ],
)
def test_settings_out_of_range_are_refused_naming_field_range_and_value(given: dict, fragment: str) -> None:
    with pytest.raises(SettingError) as refused:
        RunSettings(0.5, 200, 64).updated(**given)
    assert fragment in str(refused.value) and len(str(refused.value)) < 200


def test_settings_changes_broker_and_learner() -> None:
    old = RunSettings(0.5, 200, 64)
    new = old.updated(alpha=1.0, samples_per_iteration=100)
    assert new == RunSettings(1.0, 200, 100)
    assert changes(old, new) == [
        {"name": "alpha", "old_value": 0.5, "new_value": 1.0},
        {"name": "samples_per_iteration", "old_value": 64, "new_value": 100},
    ]
    assert learner_changes({"learning_rate": 3e-4, "ent_coef": 0.01}, {"learning_rate": 1e-4, "ent_coef": 0.01}) == [
        {"name": "learning_rate", "old_value": 3e-4, "new_value": 1e-4}
    ]
    # Unknown (no positive learning rate reported) on either side: no change reported.
    assert learner_changes(None, {"learning_rate": 1e-4}) == []
    assert learner_changes({"learning_rate": 0.0}, {"learning_rate": 1e-4}) == []
    assert learner_changes({"learning_rate": 1e-4}, {"policy_loss": 1.0}) == []
    # Once the learner reports its hyper-parameters, an entropy coefficient of 0 is a value like any other.
    assert learner_changes({"learning_rate": 1e-4, "ent_coef": 0.0}, {"learning_rate": 1e-4, "ent_coef": 0.01}) == [
        {"name": "ent_coef", "old_value": 0.0, "new_value": 0.01}
    ]


def test_history_since_pages_and_keeps_the_newest() -> None:
    history = MetricsHistory(capacity=5)
    assert history.since(0) == []
    for i in range(1, 9):
        history.append({"iteration": i})
    held = [m["iteration"] for m in history.since(0)]
    assert held == [4, 5, 6, 7, 8]  # the oldest fell off
    assert [m["iteration"] for m in history.since(5, max_count=2)] == [6, 7]
    assert history.since(8) == [] and history.since(5, max_count=0) == []
    assert [m["iteration"] for m in history.since(-3)] == held


def test_history_follow_streams_held_then_new_then_ends_and_unsubscribes() -> None:
    async def go():
        history = MetricsHistory()
        for i in (1, 2):
            history.append({"iteration": i})
        seen: list[int] = []

        async def watch() -> None:
            async for metrics in history.follow(1):
                seen.append(metrics["iteration"])

        task = asyncio.create_task(watch())
        for i in (3, 4):
            await asyncio.sleep(0.01)
            history.append({"iteration": i})
        await asyncio.sleep(0.01)
        assert history.watchers == 1 and not task.done()
        history.close()
        await asyncio.wait_for(task, 5)

        # A watcher whose client goes away (its task cancelled while waiting) leaves no subscriber.
        gone = asyncio.create_task(watch_forever(history := MetricsHistory()))
        await asyncio.sleep(0.01)
        assert history.watchers == 1
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        return seen, history.watchers

    async def watch_forever(history: MetricsHistory) -> None:
        async for _ in history.follow(0):
            pass

    seen, watchers_left = asyncio.run(go())
    assert seen == [2, 3, 4] and watchers_left == 0

"""The run's figures as Prometheus metric families, built fresh from one status snapshot per scrape.

The gateway keeps no state: counters and histograms are the broker's own totals since the run
started (GetRunStatus), so a restarted gateway exposes the same series.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from fast.v1 import broker_pb2, learner_pb2
from gateway.upstream import policy_version_lag

_STATES = ("starting", "running", "pausing", "paused", "done", "failed")
_LAST_ITERATION = {
    "raw_throughput": ("fast_raw_throughput", "Transitions per second of sampling, padding included (last iteration)"),
    "effective_throughput": ("fast_effective_throughput", "Valid transitions per second of sampling (last iteration)"),
    "validity": ("fast_validity_eta", "Valid over all transitions, eta (last iteration)"),
    "time_efficiency": ("fast_time_efficiency", "Stepping over stepping + resetting time (last iteration)"),
    "sampling_time_s": ("fast_sampling_seconds", "Sampling wall time of the last iteration"),
    "iteration_time_s": ("fast_iteration_seconds", "Wall time of the last iteration, update included"),
}
_UPDATE = {
    "policy_loss": "Clipped surrogate loss",
    "value_loss": "Value loss",
    "entropy": "Policy entropy",
    "approx_kl": "Approximate KL between the sampling and the updated policy",
    "clip_fraction": "Fraction of valid transitions whose ratio was clipped",
    "explained_variance": "Explained variance of the values against the returns",
    "grad_norm": "Global gradient norm before clipping",
    "update_time_s": "Seconds of the last update",
    "learning_rate": "Learning rate of the last update",
    "ent_coef": "Entropy coefficient of the last update",
    "reward_scale": "What the last update divided rewards by (1 without reward normalisation)",
    "lr_anneal_factor": "Annealing factor of the last update's learning rate (1 without annealing)",
}


def _gauge(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family


def _histogram(name: str, doc: str, histogram: broker_pb2.Histogram) -> HistogramMetricFamily:
    buckets = [(repr(float(b)), int(c)) for b, c in zip(histogram.upper_bounds, histogram.cumulative_counts)]
    total = int(histogram.cumulative_counts[-1]) if histogram.cumulative_counts else 0
    buckets.append(("+Inf", total))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=histogram.sum)


def families(
    run: broker_pb2.GetRunStatusResponse | None,
    learner: learner_pb2.GetStatusResponse | None,
    others_up: dict[str, bool] | None = None,
) -> Iterator[Metric]:
    """The run's figures: broker 0's (`run`) and rank 0's (`learner`); `others_up`: whether each further
    broker and rank ("broker-1", "learner-1", ...) could be read, for fast_upstream_up."""
    up = GaugeMetricFamily("fast_upstream_up", "1 when the gateway could read the service's status", labels=["service"])
    up.add_metric(["broker"], float(run is not None))
    up.add_metric(["learner"], float(learner is not None))
    for service, answered in (others_up or {}).items():
        up.add_metric([service], float(answered))
    yield up
    if run is not None:
        yield from _run_families(run)
    if learner is not None:
        yield _gauge("fast_learner_policy_version", "The learner's current policy version", learner.policy_version)
        yield CounterMetricFamily(
            "fast_learner_stale_batches_refused", "Batches refused as stale", value=learner.stale_batches_refused
        )
        for name, doc in _UPDATE.items():
            value = getattr(learner.last_stats, name)
            if learner.HasField("last_stats") and math.isfinite(value):
                yield _gauge("fast_update_seconds" if name == "update_time_s" else f"fast_update_{name}", doc, value)
    if run is not None and learner is not None:
        lag = policy_version_lag(run, learner)
        yield _gauge("fast_policy_version_lag", "The learner's version minus the broker's sampling version", lag)


def _run_families(run: broker_pb2.GetRunStatusResponse) -> Iterator[Metric]:
    state = GaugeMetricFamily("fast_run_state", "1 for the run's current state", labels=["state"])
    for word in _STATES:
        state.add_metric([word], float(broker_pb2.RunState.Name(run.state) == f"RUN_STATE_{word.upper()}"))
    yield state
    yield _gauge("fast_iteration", "Iterations completed", run.iteration)
    yield _gauge("fast_policy_version", "Policy version the broker samples with", run.policy_version)
    yield _gauge("fast_slots", "Slots in use", run.num_slots)
    yield CounterMetricFamily("fast_valid_transitions", "Valid transitions sampled", value=run.valid_steps_total)
    yield CounterMetricFamily("fast_transitions", "Transitions sampled, padding included", value=run.transitions_total)
    yield CounterMetricFamily("fast_global_resets", "Resets of all slots at once", value=run.global_resets_total)
    yield CounterMetricFamily("fast_faults", "Slot-steps lost to simulator faults", value=run.faults_total)
    yield CounterMetricFamily("fast_stale_batches", "Batches the learner refused as stale", value=run.stale_batches)
    if run.HasField("settings"):
        yield _gauge("fast_setting_alpha", "DPSA alpha in force", run.settings.alpha)
        yield _gauge("fast_setting_t_max", "t_max in force", run.settings.t_max)
        yield _gauge("fast_setting_samples_per_iteration", "Samples per iteration", run.settings.samples_per_iteration)
        auto = {"mode": run.settings.mode or run.mode, "auto": "true" if run.settings.mode_auto else "false"}
        yield _gauge(
            "fast_setting_mode", "1, labelled with the sampling mode in force and whether it is chosen", 1, auto
        )
    if run.HasField("last_metrics"):
        last = run.last_metrics
        for field, (name, doc) in _LAST_ITERATION.items():
            value = getattr(last, field)
            if math.isfinite(value):
                yield _gauge(name, doc, value)
    if run.HasField("episode_length_histogram"):
        yield _histogram("fast_episode_length", "Length of every episode that ended", run.episode_length_histogram)
    if run.HasField("episode_return_histogram"):
        yield _histogram(
            "fast_episode_return", "Return of every episode the environment ended", run.episode_return_histogram
        )
    per_simulator = {
        "up": GaugeMetricFamily("fast_simulator_up", "1 while its calls succeed", labels=["address"]),
        "slots": GaugeMetricFamily("fast_simulator_slots", "Slots it contributes", labels=["address"]),
        "step": GaugeMetricFamily(
            "fast_simulator_step_latency_seconds", "Mean wall time of its Step calls", labels=["address"]
        ),
        "reset": GaugeMetricFamily(
            "fast_simulator_reset_latency_seconds", "Mean wall time of its Reset calls", labels=["address"]
        ),
        "faults": CounterMetricFamily("fast_simulator_faults", "Failed or timed-out calls", labels=["address"]),
        "readmissions": CounterMetricFamily("fast_simulator_readmissions", "Re-admissions", labels=["address"]),
    }
    for sim in run.simulators:
        per_simulator["up"].add_metric([sim.address], float(sim.up))
        per_simulator["slots"].add_metric([sim.address], sim.num_slots)
        per_simulator["step"].add_metric([sim.address], sim.step_latency_s)
        per_simulator["reset"].add_metric([sim.address], sim.reset_latency_s)
        per_simulator["faults"].add_metric([sim.address], sim.faults)
        per_simulator["readmissions"].add_metric([sim.address], sim.readmissions)
    yield from per_simulator.values()

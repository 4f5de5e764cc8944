"""The broker's metrics and settings on the wire: the metrics dict (one metrics.jsonl line, as
BrokerRun builds it) to and from fast.v1.IterationMetrics, RunSettings, and histograms.

The dict is the record (docs/metrics.md); the proto carries the same figures under the same
names. Where the dict holds NaN for "none" (a mean over no episode) the proto leaves the
optional field unset, and the learner's NaN statistics are None in the dict and NaN on the
wire (UpdateStats has no optional fields). Keys the proto has no field for are not sent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from google.protobuf.descriptor import FieldDescriptor

from broker.histogram import CumulativeHistogram
from broker.settings import RunSettings
from fast.v1 import broker_pb2 as pb
from fast.v1 import learner_pb2

# Top-level figures that are plain fields of IterationMetrics under the same name.
_SCALARS = tuple(
    f.name
    for f in pb.IterationMetrics.DESCRIPTOR.fields
    if not f.is_repeated and f.type != FieldDescriptor.TYPE_MESSAGE and not f.has_presence
)
# Means over the iteration's episodes: NaN in the dict when none ended, unset on the wire.
_OPTIONAL_MEANS = ("episode_length_mean", "episode_return_mean")
_TIME_SPLIT = tuple(f.name for f in pb.TimeSplit.DESCRIPTOR.fields)
_EPISODE_ENDS = tuple(f.name for f in pb.EpisodeEnds.DESCRIPTOR.fields)
_UPDATE_STATS = {f.name: f for f in learner_pb2.UpdateStats.DESCRIPTOR.fields}
_SETTINGS = tuple(f.name for f in pb.RunSettings.DESCRIPTOR.fields)


def metrics_to_proto(metrics: Mapping) -> pb.IterationMetrics:
    """One iteration's metrics dict as IterationMetrics; a key the dict lacks leaves its field unset."""
    message = pb.IterationMetrics()
    for name in _SCALARS:
        if metrics.get(name) is not None:
            setattr(message, name, _cast(pb.IterationMetrics.DESCRIPTOR.fields_by_name[name], metrics[name]))
    for name in _OPTIONAL_MEANS:
        value = metrics.get(name)
        if value is not None and not math.isnan(value):
            setattr(message, name, float(value))
    message.episode_lengths.extend(int(n) for n in metrics.get("episode_lengths") or ())
    message.episode_returns.extend(float(r) for r in metrics.get("episode_returns") or ())
    if metrics.get("time_split_s") is not None:
        split = metrics["time_split_s"]
        message.time_split_s.CopyFrom(pb.TimeSplit(**{k: float(split[k]) for k in _TIME_SPLIT if k in split}))
    if metrics.get("episode_ends") is not None:
        ends = metrics["episode_ends"]
        message.episode_ends.CopyFrom(pb.EpisodeEnds(**{k: int(ends[k]) for k in _EPISODE_ENDS if k in ends}))
    for name, value in (metrics.get("closed_loop") or {}).items():
        message.closed_loop[name] = float(value)
    if metrics.get("pool_calls") is not None:
        message.pool_calls.CopyFrom(pb.PoolCalls(**metrics["pool_calls"]))
    if metrics.get("learner") is not None:
        message.learner.CopyFrom(learner_stats_to_proto(metrics["learner"]))
    if metrics.get("settings") is not None:
        s = metrics["settings"]
        message.settings.CopyFrom(pb.RunSettings(**{k: _cast_setting(k, s[k]) for k in _SETTINGS if k in s}))
    for change in metrics.get("settings_changed") or ():
        message.settings_changed.add(name=str(change["name"]), **_change_values(change))
    return message


def metrics_from_proto(message: pb.IterationMetrics) -> dict:
    """IterationMetrics as the dict BrokerRun writes to metrics.jsonl (the same keys, NaN for an unset mean)."""
    metrics: dict = {name: getattr(message, name) for name in _SCALARS}
    for name in _OPTIONAL_MEANS:
        metrics[name] = getattr(message, name) if message.HasField(name) else math.nan
    metrics["episode_lengths"] = list(message.episode_lengths)
    metrics["episode_returns"] = list(message.episode_returns)
    if message.HasField("time_split_s"):
        metrics["time_split_s"] = {k: getattr(message.time_split_s, k) for k in _TIME_SPLIT}
    if message.HasField("episode_ends"):
        # The dict counts only the causes that happened (a defaultdict in broker/metrics.py).
        metrics["episode_ends"] = {k: getattr(message.episode_ends, k) for k in _EPISODE_ENDS}
        metrics["episode_ends"] = {k: v for k, v in metrics["episode_ends"].items() if v}
    metrics["closed_loop"] = dict(sorted(message.closed_loop.items()))
    if message.HasField("pool_calls"):
        fields = pb.PoolCalls.DESCRIPTOR.fields
        metrics["pool_calls"] = {f.name: getattr(message.pool_calls, f.name) for f in fields}
    if message.HasField("learner"):
        metrics["learner"] = learner_stats_from_proto(message.learner)
    if message.HasField("settings"):
        metrics["settings"] = {k: getattr(message.settings, k) for k in _SETTINGS}
    if message.settings_changed:
        metrics["settings_changed"] = [
            {
                "name": c.name,
                "old_value": c.old_text if c.old_text or c.new_text else c.old_value,
                "new_value": c.new_text if c.old_text or c.new_text else c.new_value,
            }
            for c in message.settings_changed
        ]
    return metrics


def learner_stats_to_proto(stats: Mapping) -> learner_pb2.UpdateStats:
    """The learner dict of a metrics line (None where the learner had NaN) as UpdateStats."""
    message = learner_pb2.UpdateStats()
    for name, value in stats.items():
        field = _UPDATE_STATS.get(name)
        if field is not None:
            setattr(message, name, math.nan if value is None else _cast(field, value))
    return message


def learner_stats_from_proto(message: learner_pb2.UpdateStats) -> dict:
    """UpdateStats as the learner dict of a metrics line: every field, NaN as None.

    (A learning_rate or ent_coef of 0 may be a learner that does not report it; only
    broker/settings.py's change detection needs to tell, and it treats 0 as unknown.)"""
    return {
        name: None if isinstance(value, float) and math.isnan(value) else value
        for name, value in ((name, getattr(message, name)) for name in _UPDATE_STATS)
    }


def settings_to_proto(settings: RunSettings) -> pb.RunSettings:
    return pb.RunSettings(
        alpha=settings.alpha,
        t_max=settings.t_max,
        samples_per_iteration=settings.samples_per_iteration,
        alpha_auto=settings.alpha_auto,
        mode=settings.mode,
        mode_auto=settings.mode_auto,
    )


def _change_values(change: Mapping) -> dict:
    """A settings_changed entry's values as SettingChange's fields: a word (mode's) in the text fields."""
    old, new = change["old_value"], change["new_value"]
    if isinstance(old, str) or isinstance(new, str):
        return {"old_text": str(old), "new_text": str(new)}
    return {"old_value": float(old), "new_value": float(new)}


def histogram_to_proto(histogram: CumulativeHistogram) -> pb.Histogram:
    return pb.Histogram(
        upper_bounds=histogram.upper_bounds, cumulative_counts=histogram.cumulative_counts, sum=histogram.sum
    )


def _cast(field: FieldDescriptor, value):
    if field.type == FieldDescriptor.TYPE_BOOL:
        return bool(value)
    if field.type == FieldDescriptor.TYPE_STRING:
        return str(value)
    if field.type == FieldDescriptor.TYPE_DOUBLE:
        return float(value)
    return int(value)


def _cast_setting(name: str, value):
    return _cast(pb.RunSettings.DESCRIPTOR.fields_by_name[name], value)

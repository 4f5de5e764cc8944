"""Is a simulator's answer one the broker may use? Describe, Reset and Step replies checked
against what was asked and the spaces agreed at Describe; no transport.

A simulator is another program, possibly another team's, possibly broken: the broker trusts
nothing it sends back. Each check returns "" when the answer keeps the contract of
protos/fast/v1/simulator.proto, else one sentence that starts with the field at fault and
quotes the input bounded (fast/quoting.py). The pool (broker/pool.py) treats a bad answer as a
fault of that simulator: nothing of it reaches a batch.

Checked: the slots answered are those asked, in order; observations are [k, *obs_shape] of
the space's dtype, finite where the space is a float Box, in [0, n) where it is Discrete;
rewards are float [k] and finite; terminated and truncated are bool [k], never both true in a
slot; one EpisodeSummary per slot that ended and none for another, without NaN; timings are
finite and not negative; a StepStream answer carries its request's id. Not checked:
observations within the Box bounds (Gymnasium environments leave them routinely).
"""

from __future__ import annotations

import math

import numpy as np

from fast.quoting import quote
from fast.spaces import SpaceSpec
from fast.v1 import simulator_pb2 as pb
from sim_server.client import ResetReply, ServerDescription, StepReply

# A pool allocates per-slot arrays when a server joins: a server claiming 2**31 slots must be
# refused, not obeyed. Far above any real server (a few hundred slots).
MAX_SLOTS_PER_SERVER = 1 << 16
# Episode metrics land in every iteration's metrics.jsonl; these bound what one summary adds.
MAX_EPISODE_METRICS = 256
MAX_METRIC_NAME = 128


def description_problem(desc: ServerDescription) -> str:
    """ "" when a Describe answer can be served by a pool (its spaces decoded already, checked by
    fast.spaces), else what is wrong."""
    if not 1 <= desc.num_slots <= MAX_SLOTS_PER_SERVER:
        return f"num_slots is {desc.num_slots}; a server must have 1 to {MAX_SLOTS_PER_SERVER} slots"
    if desc.num_clips < 1:
        return f"num_clips is {desc.num_clips}; a server must have at least one clip"
    maps = desc.clip_map_ids
    if maps.size and maps.size != desc.num_clips:
        return f"clip_map_ids has {maps.size} entries for {desc.num_clips} clips; give one map id per clip, or none"
    if maps.size and maps.min() < 0:
        return "clip_map_ids holds a negative map id; map ids are >= 0"
    return ""


def reset_problem(reply: ResetReply, asked: np.ndarray, space: SpaceSpec) -> str:
    """ "" when a Reset answer for local slots `asked` fits `space`, else the field at fault and why."""
    return (
        _slots_problem(reply.slot_ids, asked)
        or _observations_problem(reply.observations, asked.size, space)
        or _timing_problem(reply.timing)
    )


def step_problem(reply: StepReply, asked: np.ndarray, space: SpaceSpec) -> str:
    """ "" when a Step answer for local slots `asked` fits `space`, else the field at fault and why."""
    k = asked.size
    problem = (
        _request_id_problem(reply)
        or _slots_problem(reply.slot_ids, asked)
        or _observations_problem(reply.observations, k, space)
        or _vector_problem("rewards", reply.rewards, k, "f", "float32")
        or _vector_problem("terminated", reply.terminated, k, "b", "bool")
        or _vector_problem("truncated", reply.truncated, k, "b", "bool")
    )
    if problem:
        return problem
    if not np.isfinite(reply.rewards).all():
        j = int(np.flatnonzero(~np.isfinite(reply.rewards))[0])
        return f"rewards: slot {int(asked[j])} has reward {reply.rewards[j].item()}; rewards must be finite"
    done = reply.terminated | reply.truncated
    if not done.any():  # the usual step: no episode ended, so no summary may come
        return _episodes_problem(reply.episodes, {}) or _timing_problem(reply.timing)
    both = np.flatnonzero(reply.terminated & reply.truncated)
    if both.size:
        return (
            f"terminated/truncated: slot {int(asked[both[0]])} is both terminated and truncated; "
            "at most one may be true"
        )
    ended = dict(zip(asked[done].tolist(), reply.terminated[done].tolist()))  # slot -> terminated
    return _episodes_problem(reply.episodes, ended) or _timing_problem(reply.timing)


def _request_id_problem(reply: StepReply) -> str:
    if reply.request_id != reply.sent_request_id:
        return (
            f"request_id: the answer carries {reply.request_id} for request {reply.sent_request_id}; "
            "a StepStream answer must echo its request's id, in order"
        )
    return ""


def _slots_problem(answered: np.ndarray, asked: np.ndarray) -> str:
    if answered.shape != asked.shape or not (answered == asked).all():
        return (
            f"slot_ids: answered {quote(answered.tolist())} for {quote(asked.tolist())}; "
            "they must be those asked, in order"
        )
    return ""


def _observations_problem(observations: np.ndarray, k: int, space: SpaceSpec) -> str:
    expected = (k, *space.shape)
    if observations.shape != expected or observations.dtype != space.dtype:
        return (
            f"observations: expected shape {list(expected)} of {np.dtype(space.dtype).name}, got shape "
            f"{quote(list(observations.shape))} of {observations.dtype.name}"
        )
    if space.kind == "box" and observations.dtype.kind == "f" and not np.isfinite(observations).all():
        bad = ~np.isfinite(observations.reshape(k, -1)).all(axis=1)
        if bad.any():
            return f"observations: {int(bad.sum())} of {k} hold NaN or inf, first at position {int(np.argmax(bad))}"
    if space.kind == "discrete" and k and (observations.min() < 0 or observations.max() >= space.n):
        return f"observations: a Discrete({space.n}) observation must lie in [0, {space.n})"
    return ""


def _vector_problem(name: str, values: np.ndarray, k: int, kind: str, dtype_name: str) -> str:
    if values.shape != (k,) or values.dtype.kind != kind:
        return f"{name}: expected {dtype_name} [{k}], got shape {quote(list(values.shape))} of {values.dtype.name}"
    return ""


def _episodes_problem(episodes: list[pb.EpisodeSummary], ended: dict[int, bool]) -> str:
    """`ended`: slot -> terminated, for every slot whose episode ended in this step."""
    seen: set[int] = set()
    for episode in episodes:
        slot = episode.slot_id
        if slot not in ended:
            return f"episodes: a summary for slot {slot}, whose episode did not end in this step"
        if slot in seen:
            return f"episodes: two summaries for slot {slot}"
        seen.add(slot)
        if episode.terminated != ended[slot]:
            return f"episodes: slot {slot}'s summary says terminated={episode.terminated}, its flag the opposite"
        if math.isnan(episode.episode_return):
            return f"episodes: slot {slot}'s episode_return is NaN"
        if len(episode.metrics) > MAX_EPISODE_METRICS:
            return f"episodes: slot {slot}'s summary has {len(episode.metrics)} metrics, at most {MAX_EPISODE_METRICS}"
        for name, value in episode.metrics.items():
            if len(name) > MAX_METRIC_NAME:
                return f"episodes: slot {slot} has a metric name of {len(name)} characters ({quote(name)})"
            if math.isnan(value):
                return f"episodes: slot {slot}'s metric {quote(name)} is NaN"
    missing = [slot for slot in ended if slot not in seen]
    if missing:
        return f"episodes: no summary for slot {missing[0]}, whose episode ended ({len(missing)} missing in all)"
    return ""


def _timing_problem(timing: pb.ServerTiming | None) -> str:
    if timing is None:
        return ""
    for name in ("compute_s", "emulated_s", "queued_s"):
        value = getattr(timing, name)
        if not (math.isfinite(value) and value >= 0):
            return f"timing.{name} is {value}; a duration is finite and not negative"
    for name in ("map_loads", "map_cache_hits"):
        if getattr(timing, name) < 0:
            return f"timing.{name} is {getattr(timing, name)}; a count is not negative"
    return ""

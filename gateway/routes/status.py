"""GET /v1/status: the run, its simulators, its settings and its last iteration, typed; with every
broker and learner rank of a run of several, and their totals."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter

from fast.v1 import broker_pb2, learner_pb2
from gateway.convert import enum_word, to_plain
from gateway.deps import UpstreamsDep
from gateway.errors import upstream_detail
from gateway.models import Status, Totals
from gateway.upstream import Upstream, UpstreamError, Upstreams, policy_version_lag

router = APIRouter(prefix="/v1", tags=["status"])

RunResult = broker_pb2.GetRunStatusResponse | UpstreamError
LearnerResult = learner_pb2.GetStatusResponse | UpstreamError


def _broker_plain(run: broker_pb2.GetRunStatusResponse) -> dict[str, Any]:
    plain = to_plain(run)
    plain["state"] = enum_word(plain["state"], "RUN_STATE_")
    return plain


def _answered(results: Sequence[Any]) -> list[Any]:
    return [r for r in results if not isinstance(r, UpstreamError)]


def _common(values: list[Any]) -> tuple[Any, bool]:
    """(the value all hold, False), or (None, True) when they differ."""
    distinct = set(values)
    return (values[0], False) if len(distinct) == 1 else (None, len(distinct) > 1)


def _down(upstream: Upstream, error: UpstreamError) -> dict[str, Any]:
    return {
        "name": upstream.service,
        "address": upstream.address,
        "up": False,
        "unavailable": upstream_detail(error),
        "grpc_status": error.code.name,
    }


def _finite_sum(values: list[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) if finite else None


def totals(upstreams: Upstreams, runs: Sequence[RunResult], learners: Sequence[LearnerResult]) -> Totals:
    brokers, ranks = _answered(runs), _answered(learners)
    last = [run.last_metrics for run in brokers if run.HasField("last_metrics")]
    state, states_differ = _common([run.state for run in brokers])
    version, versions_differ = _common([run.policy_version for run in brokers])
    learner_version, learner_versions_differ = _common([rank.policy_version for rank in ranks])
    return Totals(
        brokers=len(upstreams.brokers),
        brokers_answered=len(brokers),
        ranks=len(upstreams.learners),
        ranks_answered=len(ranks),
        num_slots=sum(run.num_slots for run in brokers),
        valid_steps_total=sum(run.valid_steps_total for run in brokers),
        transitions_total=sum(run.transitions_total for run in brokers),
        global_resets_total=sum(run.global_resets_total for run in brokers),
        faults_total=sum(run.faults_total for run in brokers),
        stale_batches=sum(run.stale_batches for run in brokers),
        raw_throughput=_finite_sum([m.raw_throughput for m in last]),
        effective_throughput=_finite_sum([m.effective_throughput for m in last]),
        last_iteration_transitions=sum(m.transitions for m in last),
        last_iteration_valid_transitions=sum(m.valid_transitions for m in last),
        state=None if state is None else enum_word(broker_pb2.RunState.Name(state), "RUN_STATE_"),
        states_differ=states_differ,
        policy_version=version,
        policy_versions_differ=versions_differ,
        learner_policy_version=learner_version,
        learner_policy_versions_differ=learner_versions_differ,
    )


def status_view(upstreams: Upstreams, runs: Sequence[RunResult], learners: Sequence[LearnerResult]) -> Status:
    """Broker 0's and rank 0's status at the top (the first that answered, when they are down), every
    broker and rank in `brokers` and `ranks`. No broker or no rank answered: the first one's error."""
    brokers, ranks = _answered(runs), _answered(learners)
    if not brokers:
        raise runs[0]
    if not ranks:
        raise learners[0]
    run, learner = brokers[0], ranks[0]
    plain = _broker_plain(run)
    plain["learner"] = to_plain(learner)
    plain["policy_version_lag"] = policy_version_lag(run, learner)
    plain["brokers"] = [
        _down(u, r)
        if isinstance(r, UpstreamError)
        else {"name": u.service, "address": u.address, "up": True, "run": _broker_plain(r)}
        for u, r in zip(upstreams.brokers, runs)
    ]
    plain["ranks"] = [
        {**_down(u, r), "rank": i}
        if isinstance(r, UpstreamError)
        else {"name": u.service, "rank": i, "address": u.address, "up": True, "status": to_plain(r)}
        for i, (u, r) in enumerate(zip(upstreams.learners, learners))
    ]
    plain["totals"] = totals(upstreams, runs, learners)
    return Status.model_validate(plain)


@router.get("/status", response_model=Status)
async def get_status(upstreams: UpstreamsDep) -> Status:
    """One broker and one learner: as ever, 503 (or 504) naming the one that is down. Several: the
    brokers and ranks that are down show as down in `brokers` and `ranks`, and `totals` counts those
    that answered; 503 only when no broker, or no rank, answered."""
    runs, learners = await asyncio.gather(upstreams.run_statuses(), upstreams.learner_statuses())
    return status_view(upstreams, runs, learners)

"""GET /v1/status: the run, its simulators, its settings and its last iteration, typed."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from fast.v1 import broker_pb2, learner_pb2
from gateway.convert import enum_word, to_plain
from gateway.deps import UpstreamsDep
from gateway.models import Status
from gateway.upstream import policy_version_lag

router = APIRouter(prefix="/v1", tags=["status"])


def status_view(run: broker_pb2.GetRunStatusResponse, learner: learner_pb2.GetStatusResponse) -> Status:
    plain = to_plain(run)
    plain["state"] = enum_word(plain["state"], "RUN_STATE_")
    plain["learner"] = to_plain(learner)
    plain["policy_version_lag"] = policy_version_lag(run, learner)
    return Status.model_validate(plain)


@router.get("/status", response_model=Status)
async def get_status(upstreams: UpstreamsDep) -> Status:
    run, learner = await asyncio.gather(upstreams.run_status(), upstreams.learner_status())
    return status_view(run, learner)

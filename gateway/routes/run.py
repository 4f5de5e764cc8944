"""POST /v1/run/pause|resume|stop: take effect at the next iteration boundary; no collected data is lost."""

from __future__ import annotations

from fastapi import APIRouter

from fast.v1 import broker_pb2
from gateway.convert import enum_word
from gateway.deps import Authorized, UpstreamsDep
from gateway.models import AUTH_RESPONSES, RunControlAnswer

router = APIRouter(prefix="/v1/run", tags=["run"], dependencies=[Authorized])


async def _control(upstreams, action: int, note: str) -> RunControlAnswer:
    reply = await upstreams.control(action)
    return RunControlAnswer(state=enum_word(broker_pb2.RunState.Name(reply.state), "RUN_STATE_"), note=note)


@router.post("/pause", response_model=RunControlAnswer, responses=AUTH_RESPONSES)
async def pause(upstreams: UpstreamsDep) -> RunControlAnswer:
    return await _control(upstreams, broker_pb2.CONTROL_ACTION_PAUSE, "the iteration in progress finishes, then waits")


@router.post("/resume", response_model=RunControlAnswer, responses=AUTH_RESPONSES)
async def resume(upstreams: UpstreamsDep) -> RunControlAnswer:
    return await _control(upstreams, broker_pb2.CONTROL_ACTION_RESUME, "sampling goes on from the next iteration")


@router.post("/stop", response_model=RunControlAnswer, responses=AUTH_RESPONSES)
async def stop(upstreams: UpstreamsDep) -> RunControlAnswer:
    return await _control(
        upstreams, broker_pb2.CONTROL_ACTION_STOP, "the iteration in progress finishes, then the run ends"
    )

"""POST /v1/run/pause|resume|stop: to every broker; each takes it at its next iteration boundary, and no
collected data is lost. A broker that fails the call is named, with what the others made of it
(gateway/fanout.py)."""

from __future__ import annotations

from fastapi import APIRouter

from fast.v1 import broker_pb2
from gateway.deps import Authorized, UpstreamsDep
from gateway.fanout import state_word, to_every_broker
from gateway.models import AUTH_RESPONSES, RunControlAnswer
from gateway.upstream import Upstreams

router = APIRouter(prefix="/v1/run", tags=["run"], dependencies=[Authorized])


async def _control(upstreams: Upstreams, action: int, note: str) -> RunControlAnswer:
    replies, outcomes = await to_every_broker(
        upstreams,
        "Control",
        broker_pb2.ControlRequest(action=action),
        lambda reply: {"state": state_word(reply.state)},
        check_first=action != broker_pb2.CONTROL_ACTION_STOP,
    )
    return RunControlAnswer(state=state_word(replies[0].state), note=note, brokers=outcomes)


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

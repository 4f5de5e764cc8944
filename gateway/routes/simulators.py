"""GET, POST and DELETE /v1/simulators: the simulator servers a run steps, attached and detached live.

With several brokers each steps its own share: GET lists every broker's (each entry names its
broker), POST gives a server to one broker (the one asked for, else the one with the fewest slots),
DELETE takes it from the broker that steps it.
"""

from __future__ import annotations

from typing import Annotated

import grpc
from fastapi import APIRouter, HTTPException, Path

from fast.quoting import shorten
from fast.v1 import broker_pb2
from gateway.convert import to_plain
from gateway.deps import Authorized, UpstreamsDep
from gateway.models import AUTH_RESPONSES, AttachedSimulator, AttachSimulator, DetachedSimulator, Simulator
from gateway.upstream import Upstream, UpstreamError, Upstreams

router = APIRouter(prefix="/v1/simulators", tags=["simulators"])


@router.get("", response_model=list[Simulator])
async def list_simulators(upstreams: UpstreamsDep) -> list[Simulator]:
    """Every broker's simulators, broker 0's first; a broker that does not answer: 503 naming it (a
    list without its share would look whole)."""
    runs = await upstreams.run_statuses()
    for run in runs:
        if isinstance(run, UpstreamError):
            raise run
    return [
        Simulator.model_validate({**to_plain(s), "broker": broker.service})
        for broker, run in zip(upstreams.brokers, runs)
        for s in run.simulators
    ]


async def _broker_for_new(upstreams: Upstreams, index: int | None) -> Upstream:
    """The broker asked for (after checking it answers), else the one with the fewest slots that answers."""
    if index is not None:
        if index >= len(upstreams.brokers):
            raise HTTPException(
                status_code=422,
                detail=f"broker: {index} is not a broker of this run; give 0 to {len(upstreams.brokers) - 1} "
                "(GET /v1/status lists them)",
            )
        broker = upstreams.brokers[index]
        await broker.call("GetRunStatus", broker_pb2.GetRunStatusRequest())  # down: 503 naming it
        return broker
    runs = await upstreams.run_statuses()
    answered = [(broker, run) for broker, run in zip(upstreams.brokers, runs) if not isinstance(run, UpstreamError)]
    if not answered:
        raise runs[0]
    return min(answered, key=lambda pair: pair[1].num_slots)[0]  # ties: the first


@router.post(
    "",
    status_code=201,
    response_model=AttachedSimulator,
    dependencies=[Authorized],
    responses=AUTH_RESPONSES,
)
async def attach_simulator(body: AttachSimulator, upstreams: UpstreamsDep) -> AttachedSimulator:
    """The broker checks it with Describe now: an address that does not answer (422) or a simulator
    with other spaces (409) is refused, and the run goes on; its slots join at the next iteration."""
    broker = await _broker_for_new(upstreams, body.broker)  # a broker down: 503 naming it, before the address
    try:
        reply = await upstreams.register(body.address, broker)
    except UpstreamError as error:
        if error.code != grpc.StatusCode.UNAVAILABLE:
            raise
        # The broker answered: it is the simulator named in the body that does not.
        raise HTTPException(status_code=422, detail=f"address: {shorten(error.details, 300)}") from None
    return AttachedSimulator(
        address=body.address,
        num_slots=reply.num_slots,
        env_id=reply.env_id,
        note="joins at the next iteration",
        broker=broker.service,
    )


@router.delete(
    "/{address}",
    status_code=202,
    response_model=DetachedSimulator,
    dependencies=[Authorized],
    responses={**AUTH_RESPONSES, 404: {"description": "Not attached"}, 409: {"description": "The last one"}},
)
async def detach_simulator(
    address: Annotated[str, Path(min_length=3, max_length=260, description="HOST:PORT as GET lists it")],
    upstreams: UpstreamsDep,
) -> DetachedSimulator:
    broker = await _broker_stepping(upstreams, address)
    reply = await upstreams.detach(address, broker)
    return DetachedSimulator(
        address=address, num_slots=reply.num_slots, note="drained at the next iteration boundary", broker=broker.service
    )


async def _broker_stepping(upstreams: Upstreams, address: str) -> Upstream:
    """The broker that lists `address`. Listed by none: broker 0, whose NOT_FOUND says so, unless a broker
    that does not answer might hold it (503 naming that one)."""
    if len(upstreams.brokers) == 1:
        return upstreams.broker
    runs = await upstreams.run_statuses()
    for broker, run in zip(upstreams.brokers, runs):
        if not isinstance(run, UpstreamError) and any(s.address == address for s in run.simulators):
            return broker
    for run in runs:
        if isinstance(run, UpstreamError):
            raise run
    return upstreams.broker

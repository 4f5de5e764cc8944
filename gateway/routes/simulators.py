"""GET, POST and DELETE /v1/simulators: the simulator servers a run steps, attached and detached live."""

from __future__ import annotations

from typing import Annotated

import grpc
from fastapi import APIRouter, HTTPException, Path

from fast.quoting import shorten
from gateway.convert import to_plain
from gateway.deps import Authorized, UpstreamsDep
from gateway.models import AUTH_RESPONSES, AttachedSimulator, AttachSimulator, DetachedSimulator, Simulator
from gateway.upstream import UpstreamError

router = APIRouter(prefix="/v1/simulators", tags=["simulators"])


@router.get("", response_model=list[Simulator])
async def list_simulators(upstreams: UpstreamsDep) -> list[Simulator]:
    return [Simulator.model_validate(to_plain(s)) for s in (await upstreams.run_status()).simulators]


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
    await upstreams.run_status()  # the broker itself is down: 503 naming it, before blaming the address
    try:
        reply = await upstreams.register(body.address)
    except UpstreamError as error:
        if error.code != grpc.StatusCode.UNAVAILABLE:
            raise
        # The broker answered: it is the simulator named in the body that does not.
        raise HTTPException(status_code=422, detail=f"address: {shorten(error.details, 300)}") from None
    return AttachedSimulator(
        address=body.address, num_slots=reply.num_slots, env_id=reply.env_id, note="joins at the next iteration"
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
    reply = await upstreams.detach(address)
    return DetachedSimulator(address=address, num_slots=reply.num_slots, note="drained at the next iteration boundary")

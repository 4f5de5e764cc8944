"""GET, POST and DELETE /v1/simulators: the simulator servers a run steps, attached and detached live."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from gateway.convert import to_plain
from gateway.deps import Authorized, UpstreamsDep
from gateway.models import AttachedSimulator, AttachSimulator, DetachedSimulator, Simulator

router = APIRouter(prefix="/v1/simulators", tags=["simulators"])

_AUTH_ERRORS = {401: {"description": "No bearer token"}, 403: {"description": "Not the run's token"}}


@router.get("", response_model=list[Simulator])
async def list_simulators(upstreams: UpstreamsDep) -> list[Simulator]:
    return [Simulator.model_validate(to_plain(s)) for s in (await upstreams.run_status()).simulators]


@router.post(
    "",
    status_code=201,
    response_model=AttachedSimulator,
    dependencies=[Authorized],
    responses={**_AUTH_ERRORS, 409: {"description": "Its spaces differ"}, 503: {"description": "It does not answer"}},
)
async def attach_simulator(body: AttachSimulator, upstreams: UpstreamsDep) -> AttachedSimulator:
    """The broker checks it with Describe now (a wrong address or other spaces are refused, and the run
    goes on); its slots join at the next iteration boundary."""
    reply = await upstreams.register(body.address)
    return AttachedSimulator(
        address=body.address, num_slots=reply.num_slots, env_id=reply.env_id, note="joins at the next iteration"
    )


@router.delete(
    "/{address}",
    status_code=202,
    response_model=DetachedSimulator,
    dependencies=[Authorized],
    responses={**_AUTH_ERRORS, 404: {"description": "Not attached"}, 409: {"description": "The last one"}},
)
async def detach_simulator(
    address: Annotated[str, Path(min_length=3, max_length=260, description="HOST:PORT as GET lists it")],
    upstreams: UpstreamsDep,
) -> DetachedSimulator:
    reply = await upstreams.detach(address)
    return DetachedSimulator(address=address, num_slots=reply.num_slots, note="drained at the next iteration boundary")

"""/healthz (the process is up) and /readyz (every upstream answers health), for probes."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from gateway.deps import UpstreamsDep
from gateway.models import Health, Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(upstreams: UpstreamsDep):
    broker, learner = await asyncio.gather(upstreams.broker.serving(), upstreams.learner.serving())
    answer = Readiness(ready=broker == learner == "SERVING", upstreams={"broker": broker, "learner": learner})
    return JSONResponse(answer.model_dump(), status_code=200 if answer.ready else 503)

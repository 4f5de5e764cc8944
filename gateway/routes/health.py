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
    """Ready when every broker and every learner rank answers SERVING."""
    every = [*upstreams.brokers, *upstreams.learners]
    health = await asyncio.gather(*(upstream.serving() for upstream in every))
    answer = Readiness(
        ready=all(h == "SERVING" for h in health), upstreams={u.service: h for u, h in zip(every, health)}
    )
    return JSONResponse(answer.model_dump(), status_code=200 if answer.ready else 503)

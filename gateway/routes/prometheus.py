"""GET /metrics: Prometheus exposition of the run, one status snapshot per scrape."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gateway import prometheus
from gateway.deps import UpstreamsDep
from gateway.upstream import UpstreamError

router = APIRouter(tags=["metrics"])


class _Snapshot:
    """A collector over statuses already fetched (prometheus_client collects synchronously)."""

    def __init__(self, run, learner) -> None:
        self.run, self.learner = run, learner

    def collect(self):
        return prometheus.families(self.run, self.learner)


async def _or_none(call):
    try:
        return await call
    except UpstreamError:
        return None  # exposed as fast_upstream_up 0: a scrape of a half-down stack still answers


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text exposition"}},
)
async def metrics(upstreams: UpstreamsDep) -> Response:
    run, learner = await asyncio.gather(_or_none(upstreams.run_status()), _or_none(upstreams.learner_status()))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(run, learner))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

"""GET /metrics: Prometheus exposition of the run, one status snapshot per scrape (broker 0's and rank 0's
figures; every broker's and rank's fast_upstream_up)."""

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

    def __init__(self, run, learner, others_up: dict[str, bool]) -> None:
        self.run, self.learner, self.others_up = run, learner, others_up

    def collect(self):
        return prometheus.families(self.run, self.learner, self.others_up)


def _or_none(result):
    # A failed read is exposed as fast_upstream_up 0: a scrape of a half-down stack still answers.
    return None if isinstance(result, UpstreamError) else result


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text exposition"}},
)
async def metrics(upstreams: UpstreamsDep) -> Response:
    runs, learners = await asyncio.gather(upstreams.run_statuses(), upstreams.learner_statuses())
    # The figures are broker 0's and rank 0's; every further broker and rank shows in fast_upstream_up.
    others_up = {
        upstream.service: not isinstance(result, UpstreamError)
        for upstream, result in [
            *zip(upstreams.brokers[1:], runs[1:]),
            *zip(upstreams.learners[1:], learners[1:]),
        ]
    }
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(_or_none(runs[0]), _or_none(learners[0]), others_up))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

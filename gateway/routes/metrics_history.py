"""Per-iteration metrics: the history the broker holds, and a live server-sent event stream of them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from gateway.convert import to_plain
from gateway.deps import UpstreamsDep
from gateway.models import IterationMetrics
from gateway.upstream import UpstreamError, Upstreams

router = APIRouter(prefix="/v1", tags=["metrics"])

HISTORY_LIMIT = 1000  # the broker's own cap on one answer
KEEPALIVE_S = 15.0  # a comment line this often keeps proxies from closing an idle stream


@router.get("/metrics/history", response_model=list[IterationMetrics])
async def metrics_history(
    upstreams: UpstreamsDep,
    since: Annotated[int, Query(ge=0, le=2**62, description="Iterations after this one (0: from the first)")] = 0,
    limit: Annotated[int, Query(ge=1, le=HISTORY_LIMIT, description="At most this many, oldest first")] = 1000,
) -> list[IterationMetrics]:
    return [IterationMetrics.model_validate(to_plain(m)) for m in await upstreams.history(since, limit)]


def _event(metrics) -> str:
    data = json.dumps(IterationMetrics.model_validate(to_plain(metrics)).model_dump(mode="json"))
    return f"id: {metrics.iteration}\nevent: iteration\ndata: {data}\n\n"


async def _events(upstreams: Upstreams, since: int, request: Request) -> AsyncIterator[str]:
    stream = upstreams.watch(since).__aiter__()
    pending: asyncio.Task | None = None
    try:
        yield "retry: 2000\n\n"
        while not await request.is_disconnected():
            pending = pending or asyncio.ensure_future(stream.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=KEEPALIVE_S)
            if not done:
                yield ": keep-alive\n\n"
                continue
            try:
                metrics = pending.result()
            except StopAsyncIteration:  # the run is over
                yield "event: end\ndata: {}\n\n"
                return
            except UpstreamError as error:
                problem = json.dumps({"upstream": error.service, "grpc_status": error.code.name})
                yield f"event: upstream-error\ndata: {problem}\n\n"
                return
            finally:
                if pending.done():
                    pending = None
            yield _event(metrics)
    finally:
        if pending is not None:
            pending.cancel()
        await stream.aclose()


@router.get(
    "/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "One `iteration` event per iteration"}},
)
async def events(
    request: Request,
    upstreams: UpstreamsDep,
    since: Annotated[int, Query(ge=0, le=2**62, description="Replay iterations after this one first")] = 0,
    last_event_id: Annotated[int | None, Header(ge=0, le=2**62, include_in_schema=False)] = None,
) -> StreamingResponse:
    """Server-sent events: each iteration's metrics as it ends (`event: iteration`, `id:` its number);
    `event: end` when the run is over. A reconnecting EventSource resumes after Last-Event-ID."""
    await upstreams.run_status()  # an upstream that is down answers 503 now, not mid-stream
    start = max(since, last_event_id or 0)
    return StreamingResponse(
        _events(upstreams, start, request),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )

"""The one place where a failed upstream call becomes an HTTP answer, and where request errors are shaped.

An upstream that is down answers 503 naming it; one that is slow past its deadline 504; its own
refusals keep their meaning (INVALID_ARGUMENT 422, NOT_FOUND 404, FAILED_PRECONDITION 409). A
refusal of the gateway's token is the gateway's misconfiguration, not the caller's: 502. A call sent
to every broker that some did not take (`FanOutError`) answers the first failure's status, naming
that broker, and lists what every broker made of it. No answer echoes a caller's input unbounded.
"""

from __future__ import annotations

import grpc
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from fast.quoting import shorten
from gateway.models import BrokerOutcome
from gateway.upstream import UpstreamError

_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 422,
    grpc.StatusCode.OUT_OF_RANGE: 422,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.UNIMPLEMENTED: 501,
}
_DETAIL_LIMIT = 400


def http_status(code: grpc.StatusCode) -> int:
    """The HTTP status of an upstream's gRPC status; anything unexpected is the upstream's fault: 502."""
    return _HTTP_STATUS.get(code, 502)


def upstream_detail(error: UpstreamError) -> str:
    where = f"{error.service} at {error.address}"
    details = shorten(error.details, _DETAIL_LIMIT)
    if error.code == grpc.StatusCode.UNAVAILABLE:
        return f"{where} is unavailable: {details}"
    if error.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"{where} did not answer within {error.deadline_s:g} s"
    if error.code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return f"{where} refused the gateway's run token; give the gateway the run's token (FAST_AUTH_TOKEN_FILE)"
    return f"{error.service}: {details}"


class FanOutError(Exception):
    """A call sent to every broker (gateway/fanout.py) that `first` (and maybe others) did not take;
    `outcomes`: what each broker made of it, broker 0 first; `note`: what else was left undone."""

    def __init__(self, first: UpstreamError, outcomes: list[BrokerOutcome], note: str = "") -> None:
        super().__init__(str(first))
        self.first, self.outcomes, self.note = first, outcomes, note


def fan_out_detail(error: FanOutError) -> str:
    """The failure, then which brokers took the call: none, or some (the brokers then differ)."""
    applied = [o.name for o in error.outcomes if o.applied]
    failed = [o.name for o in error.outcomes if o.error is not None]
    others = [name for name in failed if name != error.first.service]
    detail = upstream_detail(error.first) + (f" ({', '.join(others)} failed too)" if others else "")
    if applied and failed:
        detail += (
            f"; applied on {', '.join(applied)} but not on {', '.join(failed)}: the brokers differ until the same "
            "call is made again (taking it twice changes nothing)"
        )
    elif applied:  # every broker took its part; the failure is another service's (the learner's)
        detail += f"; every broker applied its part ({', '.join(applied)})"
    elif len(error.outcomes) > 1:
        detail += "; nothing was applied on any broker"
    if error.note:
        detail += f"; {error.note}"
    return shorten(detail, 2 * _DETAIL_LIMIT)


async def fan_out_error_handler(request: Request, error: FanOutError) -> JSONResponse:
    return JSONResponse(
        status_code=http_status(error.first.code),
        content={
            "detail": fan_out_detail(error),
            "upstream": error.first.service,
            "grpc_status": error.first.code.name,
            "brokers": [outcome.model_dump(mode="json") for outcome in error.outcomes],
        },
    )


async def upstream_error_handler(request: Request, error: UpstreamError) -> JSONResponse:
    return JSONResponse(
        status_code=http_status(error.code),
        content={"detail": upstream_detail(error), "upstream": error.service, "grpc_status": error.code.name},
    )


def _field(location: tuple) -> str:
    parts = [str(part) for part in location if part not in ("body", "query", "path", "header")]
    return ".".join(parts) or "body"


async def validation_error_handler(request: Request, error: RequestValidationError) -> JSONResponse:
    """422 naming each field and what it must be, without FastAPI's echo of the whole input."""
    problems = [
        {"field": _field(tuple(item.get("loc", ()))), "message": shorten(str(item.get("msg", "")), 200)}
        for item in error.errors()[:20]
    ]
    summary = "; ".join(f"{p['field']}: {p['message']}" for p in problems)
    return JSONResponse(status_code=422, content={"detail": shorten(summary, _DETAIL_LIMIT), "problems": problems})

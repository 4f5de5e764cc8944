"""The gateway's FastAPI app: routers, error handlers, limits, and the upstream channels' lifetime."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from fast.rpc import Credentials
from gateway.errors import FanOutError, fan_out_error_handler, upstream_error_handler, validation_error_handler
from gateway.models import ERROR_RESPONSES
from gateway.routes import checkpoints, config, dashboard, health, metrics_history, prometheus, run, simulators, status
from gateway.settings import GatewaySettings
from gateway.upstream import UpstreamError, Upstreams

DESCRIPTION = """REST status and control of a FAST training run.

Reads are open; every call that changes the run needs `Authorization: Bearer <run token>`
(the token `fast train` prints, or the one in `FAST_AUTH_TOKEN_FILE`). Settings changes take
effect at the next iteration (broker) or update (learner) and are recorded in metrics.jsonl.
"""


class BodyLimit:
    """413 for a request body over `max_bytes`, counted as it arrives (a lying Content-Length too)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            return await self._refuse(scope, receive, send)
        seen = 0

        async def counted() -> dict:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = JSONResponse({"detail": f"request body over {self.max_bytes} bytes"}, status_code=413)
        await answer(scope, receive, send)


class _TooLarge(Exception):
    pass


def create_app(settings: GatewaySettings, token: str, upstreams: Upstreams | None = None) -> FastAPI:
    """`token`: the run's token, required of callers and shown to the services; `upstreams` for tests."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.upstreams = upstreams or Upstreams(
            settings.broker,
            settings.learner,
            Credentials(token, settings.tls),
            deadline_s=settings.deadline_s,
            export_deadline_s=settings.export_deadline_s,
        )
        try:
            yield
        finally:
            await app.state.upstreams.close()

    app = FastAPI(title="FAST gateway", version="1", description=DESCRIPTION, lifespan=lifespan)
    app.state.token = token
    app.state.settings = settings
    app.add_exception_handler(UpstreamError, upstream_error_handler)
    app.add_exception_handler(FanOutError, fan_out_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    for module in (health, status, metrics_history, run, config, simulators, checkpoints, prometheus):
        app.include_router(module.router, responses=ERROR_RESPONSES)
    app.include_router(dashboard.router)
    if settings.cors_origins:  # closed unless origins are named (never "*": settings refuse it)
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "PATCH", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    return app

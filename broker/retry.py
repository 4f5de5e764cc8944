"""Retrying a call with doubling waits until a deadline: the one retry loop of a broker's run.

An error is retried only when it is transient (the peer is unreachable, slow or restarting);
any other error is raised as is at once. When the next wait would pass the deadline,
`RetryExpired` carries the last error. The caller turns either into its own message.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

T = TypeVar("T")

# gRPC statuses that mean "not now" rather than "no": the peer is down, slow or went away mid-call.
TRANSIENT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


class RetryExpired(Exception):
    """The deadline came before a try succeeded; `error` is the last try's error."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def transient(error: BaseException) -> bool:
    """Worth another try: any connection error, or a gRPC status of TRANSIENT_CODES."""
    return not isinstance(error, grpc.aio.AioRpcError) or error.code() in TRANSIENT_CODES


async def retry(
    call: Callable[[], Awaitable[T]],
    *,
    deadline: float,
    delay_s: float,
    max_delay_s: float,
    errors: tuple[type[BaseException], ...] = (grpc.aio.AioRpcError,),
    before_wait: Callable[[BaseException, float], None] | None = None,
) -> T:
    """`await call()` until it returns; between tries wait delay_s, doubled each time up to max_delay_s.

    Only `errors` are caught: a transient one is retried, another is raised at once, and
    RetryExpired is raised instead of a wait that would end past `deadline` (time.monotonic()).
    `before_wait(error, delay_s)` runs before each wait: to log, or to raise and stop retrying.
    """
    while True:
        try:
            return await call()
        except errors as exc:
            if not transient(exc):
                raise
            if time.monotonic() + delay_s > deadline:
                raise RetryExpired(exc) from None
            if before_wait is not None:
                before_wait(exc, delay_s)
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, max_delay_s)

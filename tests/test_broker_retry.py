"""The broker run's one retry loop: what it retries, what it raises at once, when it gives up."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from grpc.aio import AioRpcError, Metadata

from broker.retry import RetryExpired, retry


def _rpc_error(code: grpc.StatusCode) -> AioRpcError:
    return AioRpcError(code, Metadata(), Metadata(), details=f"{code.name} for the test")


def _failing(*errors: BaseException):
    """A call that raises `errors` one by one, then returns how many tries it took."""
    tries = []

    async def call():
        tries.append(1)
        if len(tries) <= len(errors):
            raise errors[len(tries) - 1]
        return len(tries)

    return call


def test_transient_errors_are_retried_with_doubling_waits_until_success() -> None:
    waits = []
    call = _failing(
        _rpc_error(grpc.StatusCode.UNAVAILABLE),
        _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED),
        ConnectionError("refused"),
    )
    tries = asyncio.run(
        retry(
            call,
            deadline=time.monotonic() + 10,
            delay_s=0.01,
            max_delay_s=0.02,
            errors=(AioRpcError, ConnectionError),
            before_wait=lambda exc, s: waits.append(s),
        )
    )
    assert tries == 4 and waits == [0.01, 0.02, 0.02]


def test_a_refusal_is_raised_at_once_and_other_errors_are_not_caught() -> None:
    with pytest.raises(AioRpcError) as refused:
        asyncio.run(
            retry(
                _failing(_rpc_error(grpc.StatusCode.FAILED_PRECONDITION)),
                deadline=time.monotonic() + 10,
                delay_s=0.01,
                max_delay_s=0.01,
            )
        )
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(ConnectionError):  # not among `errors`
        asyncio.run(
            retry(_failing(ConnectionError("x")), deadline=time.monotonic() + 10, delay_s=0.01, max_delay_s=0.01)
        )


def test_a_wait_past_the_deadline_gives_up_with_the_last_error() -> None:
    call = _failing(*[_rpc_error(grpc.StatusCode.UNAVAILABLE)] * 100)
    with pytest.raises(RetryExpired) as expired:
        asyncio.run(retry(call, deadline=time.monotonic() + 0.05, delay_s=0.02, max_delay_s=0.04))
    assert expired.value.error.code() == grpc.StatusCode.UNAVAILABLE

"""Calls that every broker of a run must take: sent to all at once, and every broker's outcome told.

A run of R learner ranks has a broker per rank; a pause, a resume, a stop or a change of alpha,
t_max or samples_per_iteration that reached some brokers only would have them sample differently.
So such a call goes in two steps:

1. every broker is asked its status first (GetRunStatus, within the deadline): when one does not
   answer, the call is refused before anything is sent, naming that broker (503: nothing was
   applied anywhere). A stop skips this step: stopping every broker that can still be reached is
   always right, and a broker that has ended already cannot answer;
2. the call goes to every broker at once. When one fails now (it went down in between, or refused
   the call), the answer is that broker's error (gateway/errors.py: 503, 504, 409, 502, ...) with
   `brokers` saying which ones applied it; those that did keep it, so the brokers differ until the
   same call is made again. Every such call can be taken twice without harm (pausing a paused
   broker, setting the alpha a broker has), so the retry is the call itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fast.v1 import broker_pb2
from gateway.convert import enum_word
from gateway.errors import FanOutError, upstream_detail
from gateway.models import BrokerOutcome
from gateway.upstream import Upstream, UpstreamError, Upstreams


def state_word(state: int) -> str:
    return enum_word(broker_pb2.RunState.Name(state), "RUN_STATE_")


def _outcome(broker: Upstream, result: Any, describe: Callable[[Any], dict]) -> BrokerOutcome:
    if isinstance(result, UpstreamError):
        return BrokerOutcome(
            name=broker.service,
            address=broker.address,
            applied=False,
            error=upstream_detail(result),
            grpc_status=result.code.name,
        )
    if result is None:  # not asked: the call stopped before it
        return BrokerOutcome(name=broker.service, address=broker.address, applied=False)
    return BrokerOutcome(name=broker.service, address=broker.address, applied=True, **describe(result))


async def check_brokers(upstreams: Upstreams, note: str = "") -> list[broker_pb2.GetRunStatusResponse]:
    """Every broker's status; FanOutError (nothing applied) naming those that do not answer."""
    statuses = await upstreams.run_statuses()
    failures = [s for s in statuses if isinstance(s, UpstreamError)]
    if failures:
        outcomes = [
            _outcome(b, s if isinstance(s, UpstreamError) else None, dict) for b, s in zip(upstreams.brokers, statuses)
        ]
        raise FanOutError(failures[0], outcomes, note)
    return statuses


async def to_every_broker(
    upstreams: Upstreams,
    method: str,
    request,
    describe: Callable[[Any], dict[str, Any]],
    *,
    check_first: bool = True,
    note_if_failed: str = "",
) -> tuple[list[Any], list[BrokerOutcome]]:
    """`method(request)` on every broker at once: their answers and outcomes (`describe` turns an answer
    into the outcome's fields), or FanOutError naming the brokers that failed and those that applied it.
    `note_if_failed`: what the caller leaves undone when a broker fails, said in the error."""
    if check_first:
        await check_brokers(upstreams, note_if_failed)
    results = await upstreams.each(upstreams.brokers, method, request)
    outcomes = [_outcome(b, r, describe) for b, r in zip(upstreams.brokers, results)]
    failures = [r for r in results if isinstance(r, UpstreamError)]
    if failures:
        raise FanOutError(failures[0], outcomes, note_if_failed)
    return results, outcomes

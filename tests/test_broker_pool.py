"""The pool's one admission rule, applied alike by SimulatorPool.add and the broker's
RegisterSimulator (no sockets: the simulators are fake clients answering Describe)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import numpy as np
import pytest
from conftest import Aborted, FakeContext

import broker.pool
import broker.servicer
from broker.pool import SimulatorPool
from broker.servicer import BrokerServicer
from fast.spaces import SpaceSpec
from fast.v1 import broker_pb2 as pb
from sim_server.client import ServerDescription


def _description(action_high: float = 1.0, num_clips: int = 40) -> ServerDescription:
    def box(n: int, high: float) -> SpaceSpec:
        return SpaceSpec(
            "box",
            (n,),
            np.dtype(np.float32),
            np.full(n, -high, np.float32),
            np.full(n, high, np.float32),
        )

    return ServerDescription(
        "takeover",
        box(6, 1e6),
        box(2, action_high),
        num_slots=3,
        num_clips=num_clips,
        cost_model=None,
        server_version="test",
    )


class FakeClient:
    """Stands in for SimulatorClient: answers Describe with a given description."""

    def __init__(self, description: ServerDescription) -> None:
        self.description = description

    async def describe(self) -> ServerDescription:
        return self.description

    async def close(self) -> None:
        pass

    async def __aenter__(self) -> "FakeClient":
        return self

    async def __aexit__(self, *exc) -> None:
        pass


@pytest.mark.parametrize(
    "joining, problem",
    [
        (
            _description(action_high=2.0),
            "action space Box(shape=(2,), dtype=float32) has other bounds than Box(shape=(2,), dtype=float32)",
        ),
        (_description(num_clips=20), "catalog of 20 clips, the pool's has 40"),
    ],
)
def test_a_mismatching_simulator_is_refused_by_the_pool_and_by_register_with_one_message(
    monkeypatch, joining: ServerDescription, problem: str
) -> None:
    fakes = {"10.0.0.1:1": _description(), "10.0.0.2:1": joining}  # address -> what it answers
    monkeypatch.setattr(broker.pool, "SimulatorClient", lambda address, **_: FakeClient(fakes[address]))
    monkeypatch.setattr(broker.servicer, "SimulatorClient", lambda address, **_: FakeClient(fakes[address]))
    expected = f"simulator 10.0.0.2:1 does not match the pool: {problem}"

    async def go():
        pool = SimulatorPool()
        await pool.add("10.0.0.1:1")
        registered: list[str] = []
        servicer = BrokerServicer(SimpleNamespace(pool=pool, register=registered.append))
        with pytest.raises(Aborted) as aborted:
            await servicer.RegisterSimulator(pb.RegisterSimulatorRequest(address="10.0.0.2:1"), FakeContext())
        with pytest.raises(ValueError) as refused:
            await pool.add("10.0.0.2:1")
        # The same server with the pool's own spaces is accepted by both.
        fakes["10.0.0.3:1"] = _description()
        reply = await servicer.RegisterSimulator(pb.RegisterSimulatorRequest(address="10.0.0.3:1"), FakeContext())
        await pool.add("10.0.0.3:1")
        return aborted.value, str(refused.value), registered, reply, pool.num_slots

    aborted, refused, registered, reply, num_slots = asyncio.run(go())
    assert aborted.code == grpc.StatusCode.FAILED_PRECONDITION
    assert aborted.details == refused == expected
    assert registered == ["10.0.0.3:1"] and reply.num_slots == 3 and num_slots == 6

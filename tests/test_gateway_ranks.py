"""The gateway of a run of two learner ranks with a broker each (`fast train --ranks 2`), against
stand-in upstreams over real gRPC on loopback (tests/test_gateway_routes.py's): every broker's and
rank's status with totals, a broker or rank down, and controls sent to every broker with one failing."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import pytest
from fastapi.testclient import TestClient
from test_gateway_routes import AUTH, TOKEN, FakeBroker, FakeLearner, Upstream, _serve

from fast.v1 import broker_pb2, broker_pb2_grpc, learner_pb2_grpc
from gateway.app import create_app
from gateway.settings import GatewaySettings


@dataclass
class Stand(Upstream):
    """A stand-in that, when `only` is given, fails those methods alone (a broker that answers its
    status but fails the control that follows)."""

    only: frozenset[str] = frozenset()

    def enter(self, method: str, request, context) -> None:
        if self.fail is not None and self.only and method not in self.only:
            self.calls.append((method, request))
            return
        super().enter(method, request, context)

    def asked(self, method: str) -> list:
        return [request for name, request in self.calls if name == method]


class RankBroker(FakeBroker):
    """FakeBroker with its own slots, throughput, version and simulator."""

    def __init__(self, upstream: Upstream, *, slots: int, throughput: float, simulator: str) -> None:
        super().__init__(upstream)
        self.slots, self.throughput, self.simulator, self.version = slots, throughput, simulator, 3

    def GetRunStatus(self, request, context):
        reply = super().GetRunStatus(request, context)
        reply.num_slots = self.slots
        reply.policy_version = self.version
        reply.last_metrics.effective_throughput = self.throughput
        reply.simulators[0].address = self.simulator
        reply.simulators[0].num_slots = self.slots
        return reply

    def DetachSimulator(self, request, context):
        self.u.enter("DetachSimulator", request, context)
        if request.address != self.simulator:
            context.abort(grpc.StatusCode.NOT_FOUND, f"simulator {request.address!r} is not attached")
        return broker_pb2.DetachSimulatorResponse(num_slots=self.slots)


class RankLearner(FakeLearner):
    def __init__(self, upstream: Upstream, version: int = 4) -> None:
        super().__init__(upstream)
        self.version = version

    def GetStatus(self, request, context):
        reply = super().GetStatus(request, context)
        reply.policy_version = self.version
        return reply


@dataclass
class TwoRanks:
    client: TestClient
    brokers: list[Stand]
    learners: list[Stand]
    fake_brokers: list[RankBroker]
    fake_learners: list[RankLearner]


@pytest.fixture()
def ranks():
    brokers, learners = [Stand(), Stand()], [Stand(), Stand()]
    fake_brokers = [
        RankBroker(brokers[0], slots=10, throughput=1234.5, simulator="127.0.0.1:7001"),
        RankBroker(brokers[1], slots=6, throughput=765.5, simulator="127.0.0.1:7002"),
    ]
    fake_learners = [RankLearner(learners[0]), RankLearner(learners[1])]
    servers = [
        _serve(lambda s, fake=fake: broker_pb2_grpc.add_BrokerServicer_to_server(fake, s)) for fake in fake_brokers
    ] + [_serve(lambda s, fake=fake: learner_pb2_grpc.add_LearnerServicer_to_server(fake, s)) for fake in fake_learners]
    ports = [port for _, port in servers]
    settings = GatewaySettings(
        broker=[f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"],
        learner=[f"127.0.0.1:{ports[2]}", f"127.0.0.1:{ports[3]}"],
        # No test here waits a deadline out (a down upstream fails at once): 1 s was missed once by a
        # stand-in answering late under the suite's load, and a live broker read as down.
        deadline_s=10.0,
    )
    try:
        with TestClient(create_app(settings, TOKEN)) as client:
            yield TwoRanks(client, brokers, learners, fake_brokers, fake_learners)
    finally:
        for server, _ in servers:
            server.stop(0)


# -- status -----------------------------------------------------------------------------------------


def test_get_status_shows_every_broker_and_rank_with_totals(ranks):
    body = ranks.client.get("/v1/status").json()
    assert body["num_slots"] == 10 and body["policy_version_lag"] == 1  # broker 0's and rank 0's, as before
    assert [(b["name"], b["up"], b["run"]["num_slots"]) for b in body["brokers"]] == [
        ("broker", True, 10),
        ("broker-1", True, 6),
    ]
    assert body["brokers"][1]["run"]["simulators"][0]["address"] == "127.0.0.1:7002"
    assert [(r["name"], r["rank"], r["up"], r["status"]["policy_version"]) for r in body["ranks"]] == [
        ("learner", 0, True, 4),
        ("learner-1", 1, True, 4),
    ]
    assert body["totals"] == {
        "brokers": 2,
        "brokers_answered": 2,
        "ranks": 2,
        "ranks_answered": 2,
        "num_slots": 16,
        "valid_steps_total": 2 * 768,
        "transitions_total": 0,
        "global_resets_total": 0,
        "faults_total": 0,
        "stale_batches": 0,
        "raw_throughput": 0.0,  # unset in the stand-ins' last iterations
        "effective_throughput": 2000.0,
        "last_iteration_transitions": 600,
        "last_iteration_valid_transitions": 512,
        "state": "running",
        "states_differ": False,
        "policy_version": 3,
        "policy_versions_differ": False,
        "learner_policy_version": 4,
        "learner_policy_versions_differ": False,
    }
    assert all(u.tokens == {f"Bearer {TOKEN}"} for u in [*ranks.brokers, *ranks.learners])


def test_get_status_flags_versions_and_states_that_differ(ranks):
    ranks.fake_brokers[1].version = 2
    ranks.fake_brokers[1].state = broker_pb2.RUN_STATE_PAUSED
    ranks.fake_learners[1].version = 5
    totals = ranks.client.get("/v1/status").json()["totals"]
    assert (totals["policy_version"], totals["policy_versions_differ"]) == (None, True)
    assert (totals["learner_policy_version"], totals["learner_policy_versions_differ"]) == (None, True)
    assert (totals["state"], totals["states_differ"]) == (None, True)


def test_get_status_one_broker_and_one_rank_down_show_as_down(ranks):
    ranks.brokers[1].fail, ranks.brokers[1].fail_details = grpc.StatusCode.UNAVAILABLE, "connection refused"
    ranks.learners[1].fail = grpc.StatusCode.UNAVAILABLE
    answer = ranks.client.get("/v1/status")
    assert answer.status_code == 200
    body = answer.json()
    down = body["brokers"][1]
    assert (down["up"], down["run"], down["grpc_status"]) == (False, None, "UNAVAILABLE")
    assert down["unavailable"].startswith("broker-1 at 127.0.0.1:") and "connection refused" in down["unavailable"]
    assert body["ranks"][1]["up"] is False and body["ranks"][1]["unavailable"].startswith("learner-1 at ")
    totals = body["totals"]
    assert (totals["brokers_answered"], totals["ranks_answered"], totals["num_slots"]) == (1, 1, 10)
    assert totals["effective_throughput"] == 1234.5


def test_get_status_broker_0_down_shows_the_next_at_the_top(ranks):
    ranks.brokers[0].fail = grpc.StatusCode.UNAVAILABLE
    body = ranks.client.get("/v1/status").json()
    assert body["num_slots"] == 6 and body["brokers"][0]["up"] is False
    assert body["totals"]["brokers_answered"] == 1


def test_get_status_every_broker_down_is_503(ranks):
    for broker in ranks.brokers:
        broker.fail = grpc.StatusCode.UNAVAILABLE
    answer = ranks.client.get("/v1/status")
    assert answer.status_code == 503 and answer.json()["upstream"] == "broker"


def test_get_readyz_asks_every_broker_and_rank(ranks):
    body = ranks.client.get("/readyz").json()
    assert body == {
        "ready": True,
        "upstreams": {"broker": "SERVING", "broker-1": "SERVING", "learner": "SERVING", "learner-1": "SERVING"},
    }


def test_get_metrics_prometheus_says_which_brokers_and_ranks_answer(ranks):
    ranks.brokers[1].fail = grpc.StatusCode.UNAVAILABLE
    text = ranks.client.get("/metrics").text
    assert 'fast_upstream_up{service="broker"} 1.0' in text and 'fast_upstream_up{service="broker-1"} 0.0' in text
    assert 'fast_upstream_up{service="learner-1"} 1.0' in text
    assert "fast_slots 10.0" in text  # the figures are broker 0's


# -- controls reach every broker --------------------------------------------------------------------


def test_post_pause_reaches_every_broker(ranks):
    answer = ranks.client.post("/v1/run/pause", headers=AUTH)
    assert answer.status_code == 200
    body = answer.json()
    assert body["state"] == "paused"
    assert [(b["name"], b["applied"], b["state"], b["error"]) for b in body["brokers"]] == [
        ("broker", True, "paused", None),
        ("broker-1", True, "paused", None),
    ]
    for broker in ranks.brokers:
        assert [r.action for r in broker.asked("Control")] == [broker_pb2.CONTROL_ACTION_PAUSE]


def test_post_pause_with_a_broker_down_applies_nothing(ranks):
    ranks.brokers[1].fail = grpc.StatusCode.UNAVAILABLE
    answer = ranks.client.post("/v1/run/pause", headers=AUTH)
    assert answer.status_code == 503
    body = answer.json()
    assert body["upstream"] == "broker-1" and body["grpc_status"] == "UNAVAILABLE"
    assert body["detail"].startswith("broker-1 at 127.0.0.1:") and "nothing was applied on any broker" in body["detail"]
    assert [(b["name"], b["applied"], b["error"] is None) for b in body["brokers"]] == [
        ("broker", False, True),  # answered its status, was not asked to pause
        ("broker-1", False, False),
    ]
    assert ranks.brokers[0].asked("Control") == [] and ranks.brokers[1].asked("Control") == []


def test_post_pause_failing_on_one_broker_says_which_applied_it_and_the_retry_mends_it(ranks):
    ranks.brokers[1].fail, ranks.brokers[1].only = grpc.StatusCode.UNAVAILABLE, frozenset({"Control"})
    answer = ranks.client.post("/v1/run/pause", headers=AUTH)
    assert answer.status_code == 503
    body = answer.json()
    assert body["upstream"] == "broker-1"
    assert "applied on broker but not on broker-1" in body["detail"]
    assert [(b["name"], b["applied"], b["state"]) for b in body["brokers"]] == [
        ("broker", True, "paused"),
        ("broker-1", False, None),
    ]
    assert body["brokers"][1]["error"].startswith("broker-1 at 127.0.0.1:")
    # The same call again, once broker-1 answers: both paused (broker 0 takes it twice, unchanged).
    ranks.brokers[1].fail = None
    retry = ranks.client.post("/v1/run/pause", headers=AUTH)
    assert retry.status_code == 200 and [b["state"] for b in retry.json()["brokers"]] == ["paused", "paused"]


def test_post_stop_reaches_the_brokers_that_answer_even_with_one_down(ranks):
    ranks.brokers[1].fail = grpc.StatusCode.UNAVAILABLE
    answer = ranks.client.post("/v1/run/stop", headers=AUTH)
    assert answer.status_code == 503
    assert [b["applied"] for b in answer.json()["brokers"]] == [True, False]
    assert [r.action for r in ranks.brokers[0].asked("Control")] == [broker_pb2.CONTROL_ACTION_STOP]


def test_post_pause_refused_by_one_broker_keeps_its_status(ranks):
    ranks.brokers[1].fail, ranks.brokers[1].only = grpc.StatusCode.FAILED_PRECONDITION, frozenset({"Control"})
    ranks.brokers[1].fail_details = "the run is done; nothing to pause"
    answer = ranks.client.post("/v1/run/pause", headers=AUTH)
    assert answer.status_code == 409
    assert answer.json()["detail"].startswith("broker-1: the run is done; nothing to pause; applied on broker")


def test_patch_config_sets_every_broker_and_rank_0(ranks):
    answer = ranks.client.patch("/v1/config", json={"alpha": 0.3, "learning_rate": 1e-4}, headers=AUTH)
    assert answer.status_code == 200
    body = answer.json()
    assert body["broker"]["settings"]["alpha"] == 0.3 and body["learner"]["effective_from_version"] == 5
    assert [(b["name"], b["applied"], b["effective_iteration"]) for b in body["brokers"]] == [
        ("broker", True, 4),
        ("broker-1", True, 4),
    ]
    for broker in ranks.brokers:
        (request,) = broker.asked("UpdateSettings")
        assert request.alpha == pytest.approx(0.3) and not request.HasField("t_max")
    # Rank 0's hyper-parameters are the group's (the other ranks refuse UpdateHyperparameters).
    assert len(ranks.learners[0].asked("UpdateHyperparameters")) == 1
    assert ranks.learners[1].asked("UpdateHyperparameters") == []


def test_patch_config_failing_on_one_broker_names_it_and_sends_no_learner_part(ranks):
    ranks.brokers[1].fail, ranks.brokers[1].only = grpc.StatusCode.UNAVAILABLE, frozenset({"UpdateSettings"})
    answer = ranks.client.patch("/v1/config", json={"t_max": 50, "ent_coef": 0.01}, headers=AUTH)
    assert answer.status_code == 503
    body = answer.json()
    assert body["upstream"] == "broker-1"
    assert [b["applied"] for b in body["brokers"]] == [True, False]
    assert body["detail"].endswith("the learner's ent_coef were not sent")
    assert ranks.learners[0].asked("UpdateHyperparameters") == []


def test_patch_config_refused_by_rank_0_after_the_brokers_says_they_applied_theirs(ranks):
    ranks.learners[0].fail, ranks.learners[0].only = (
        grpc.StatusCode.FAILED_PRECONDITION,
        frozenset({"UpdateHyperparameters"}),
    )
    ranks.learners[0].fail_details = "the run is over"
    answer = ranks.client.patch("/v1/config", json={"alpha": 0.3, "learning_rate": 1e-4}, headers=AUTH)
    assert answer.status_code == 409
    body = answer.json()
    assert body["upstream"] == "learner" and [b["applied"] for b in body["brokers"]] == [True, True]
    assert body["detail"] == (
        "learner: the run is over; every broker applied its part (broker, broker-1); "
        "the brokers' alpha were applied; send the learner's part again alone"
    )


def test_patch_config_with_rank_0_down_applies_nothing(ranks):
    ranks.learners[0].fail = grpc.StatusCode.UNAVAILABLE
    answer = ranks.client.patch("/v1/config", json={"alpha": 0.3, "learning_rate": 1e-4}, headers=AUTH)
    assert answer.status_code == 503 and answer.json()["upstream"] == "learner"
    assert ranks.brokers[0].asked("UpdateSettings") == ranks.brokers[1].asked("UpdateSettings") == []


def test_controls_need_the_token_and_reach_no_broker_without_it(ranks):
    for method, path, body in [("POST", "/v1/run/pause", None), ("PATCH", "/v1/config", {"alpha": 0.3})]:
        assert ranks.client.request(method, path, json=body).status_code == 401
        assert ranks.client.request(method, path, json=body, headers={"Authorization": "Bearer x"}).status_code == 403
    assert all(u.calls == [] for u in [*ranks.brokers, *ranks.learners])


# -- simulators: each broker steps its own share ------------------------------------------------------


def test_get_simulators_lists_every_brokers_own(ranks):
    body = ranks.client.get("/v1/simulators").json()
    assert [(s["address"], s["broker"]) for s in body] == [("127.0.0.1:7001", "broker"), ("127.0.0.1:7002", "broker-1")]


def test_post_simulator_goes_to_the_broker_with_fewest_slots_or_the_one_named(ranks):
    answer = ranks.client.post("/v1/simulators", json={"address": "127.0.0.1:7003"}, headers=AUTH)
    assert answer.status_code == 201 and answer.json()["broker"] == "broker-1"
    assert ranks.brokers[1].asked("RegisterSimulator")[0].address == "127.0.0.1:7003"
    answer = ranks.client.post("/v1/simulators", json={"address": "127.0.0.1:7004", "broker": 0}, headers=AUTH)
    assert answer.status_code == 201 and answer.json()["broker"] == "broker"
    answer = ranks.client.post("/v1/simulators", json={"address": "127.0.0.1:7005", "broker": 2}, headers=AUTH)
    assert answer.status_code == 422
    assert answer.json()["detail"].startswith("broker: 2 is not a broker of this run; give 0 to 1")


def test_delete_simulator_goes_to_the_broker_that_steps_it(ranks):
    answer = ranks.client.delete("/v1/simulators/127.0.0.1:7002", headers=AUTH)
    assert answer.status_code == 202 and answer.json()["broker"] == "broker-1"
    assert ranks.brokers[0].asked("DetachSimulator") == []
    assert ranks.client.delete("/v1/simulators/127.0.0.1:7999", headers=AUTH).status_code == 404

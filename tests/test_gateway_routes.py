"""Every route of the gateway and its failures, through FastAPI's TestClient, against stand-in
upstreams: real gRPC servers on loopback that answer as the broker and the learner would, record
what they were asked and the token they were shown, and can be slowed past the gateway's deadline."""

from __future__ import annotations

import time
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import pytest
from fastapi.testclient import TestClient
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fast.v1 import broker_pb2, broker_pb2_grpc, learner_pb2, learner_pb2_grpc
from gateway.app import create_app
from gateway.settings import GatewaySettings

TOKEN = "gateway-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Upstream:
    """What a stand-in was asked, and how it should misbehave."""

    calls: list[tuple[str, object]] = field(default_factory=list)
    tokens: set[str] = field(default_factory=set)
    delay_s: float = 0.0
    fail: grpc.StatusCode | None = None
    fail_details: str = ""

    def enter(self, method: str, request, context) -> None:
        self.calls.append((method, request))
        self.tokens.add(dict(context.invocation_metadata()).get("authorization", ""))
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail is not None:
            context.abort(self.fail, self.fail_details)


def _metrics(iteration: int) -> broker_pb2.IterationMetrics:
    m = broker_pb2.IterationMetrics(
        iteration=iteration,
        policy_version=iteration - 1,
        mode="fast",
        num_slots=10,
        transitions=300,
        valid_transitions=256,
        effective_throughput=1234.5,
        validity=256 / 300,
        time_efficiency=0.9,
        episode_lengths=[10, 20],
        episode_returns=[1.5, float("nan")],
        closed_loop={"collided": 0.25},
        settings=broker_pb2.RunSettings(alpha=0.5, t_max=200, samples_per_iteration=256, mode="fast"),
    )
    m.episode_length_mean = 15.0
    m.learner.explained_variance = float("nan")  # constant returns: undefined, must come out null
    m.learner.learning_rate = 3e-4
    return m


class FakeBroker(broker_pb2_grpc.BrokerServicer):
    def __init__(self, upstream: Upstream) -> None:
        self.u = upstream
        self.state = broker_pb2.RUN_STATE_RUNNING

    def GetRunStatus(self, request, context):
        self.u.enter("GetRunStatus", request, context)
        return broker_pb2.GetRunStatusResponse(
            state=self.state,
            mode="fast",
            iteration=3,
            policy_version=3,
            num_slots=10,
            valid_steps_total=768,
            last_metrics=_metrics(3),
            settings=broker_pb2.RunSettings(alpha=0.5, t_max=200, samples_per_iteration=256, mode="fast"),
            simulators=[
                broker_pb2.SimulatorStatus(
                    address="127.0.0.1:7001", env_id="takeover", up=True, num_slots=10, step_latency_s=0.002
                )
            ],
            episode_length_histogram=broker_pb2.Histogram(upper_bounds=[10, 100], cumulative_counts=[1, 2, 2], sum=30),
        )

    def GetMetricsHistory(self, request, context):
        self.u.enter("GetMetricsHistory", request, context)
        first = request.since_iteration + 1
        return broker_pb2.GetMetricsHistoryResponse(iterations=[_metrics(i) for i in range(first, 4)])

    def WatchMetrics(self, request, context):
        self.u.enter("WatchMetrics", request, context)
        for i in range(request.since_iteration + 1, 4):
            yield _metrics(i)

    def Control(self, request, context):
        self.u.enter("Control", request, context)
        if request.action == broker_pb2.CONTROL_ACTION_PAUSE:
            self.state = broker_pb2.RUN_STATE_PAUSED
        return broker_pb2.ControlResponse(state=self.state)

    def UpdateSettings(self, request, context):
        self.u.enter("UpdateSettings", request, context)
        return broker_pb2.UpdateSettingsResponse(
            settings=broker_pb2.RunSettings(alpha=request.alpha or 0.5, t_max=200, samples_per_iteration=256),
            effective_iteration=4,
        )

    def RegisterSimulator(self, request, context):
        self.u.enter("RegisterSimulator", request, context)
        if request.address == "127.0.0.1:1":
            context.abort(grpc.StatusCode.UNAVAILABLE, "simulator '127.0.0.1:1' did not answer Describe: refused")
        return broker_pb2.RegisterSimulatorResponse(num_slots=5, env_id="takeover")

    def DetachSimulator(self, request, context):
        self.u.enter("DetachSimulator", request, context)
        if request.address != "127.0.0.1:7001":
            context.abort(grpc.StatusCode.NOT_FOUND, f"simulator {request.address!r} is not attached")
        return broker_pb2.DetachSimulatorResponse(num_slots=10)


class FakeLearner(learner_pb2_grpc.LearnerServicer):
    def __init__(self, upstream: Upstream) -> None:
        self.u = upstream

    def GetStatus(self, request, context):
        self.u.enter("GetStatus", request, context)
        return learner_pb2.GetStatusResponse(
            initialized=True,
            policy_version=4,
            device="cpu",
            hyperparameters=learner_pb2.Hyperparameters(learning_rate=3e-4, ent_coef=0.0),
        )

    def UpdateHyperparameters(self, request, context):
        self.u.enter("UpdateHyperparameters", request, context)
        return learner_pb2.UpdateHyperparametersResponse(
            hyperparameters=learner_pb2.Hyperparameters(learning_rate=request.learning_rate, ent_coef=0.0),
            effective_from_version=5,
        )

    def ListCheckpoints(self, request, context):
        self.u.enter("ListCheckpoints", request, context)
        return learner_pb2.ListCheckpointsResponse(
            checkpoints=[learner_pb2.CheckpointInfo(path="/c/v4.pt", policy_version=4, size_bytes=10)]
        )

    def SaveCheckpoint(self, request, context):
        self.u.enter("SaveCheckpoint", request, context)
        return learner_pb2.SaveCheckpointResponse(path="/c/v4.pt", policy_version=4)

    def ExportPolicy(self, request, context):
        self.u.enter("ExportPolicy", request, context)
        return learner_pb2.ExportPolicyResponse(model=b"model-bytes", policy_version=4, observation_shape=[7])


def _serve(add) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    add(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


@pytest.fixture()
def stack():
    broker_u, learner_u = Upstream(), Upstream()
    broker, broker_port = _serve(lambda s: broker_pb2_grpc.add_BrokerServicer_to_server(FakeBroker(broker_u), s))
    learner, learner_port = _serve(lambda s: learner_pb2_grpc.add_LearnerServicer_to_server(FakeLearner(learner_u), s))
    settings = GatewaySettings(
        broker=f"127.0.0.1:{broker_port}", learner=f"127.0.0.1:{learner_port}", deadline_s=1.0, max_body_bytes=4096
    )
    try:
        with TestClient(create_app(settings, TOKEN)) as client:
            yield client, broker_u, learner_u
    finally:
        broker.stop(0)
        learner.stop(0)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- reads ----------------------------------------------------------------------------------------


def test_get_healthz(stack):
    client, _, _ = stack
    assert client.get("/healthz").json() == {"status": "ok"}


def test_get_readyz(stack):
    client, _, _ = stack
    answer = client.get("/readyz")
    assert answer.status_code == 200
    assert answer.json() == {"ready": True, "upstreams": {"broker": "SERVING", "learner": "SERVING"}}


def test_get_readyz_upstream_down():
    settings = GatewaySettings(broker=f"127.0.0.1:{_free_port()}", learner=f"127.0.0.1:{_free_port()}", deadline_s=1)
    with TestClient(create_app(settings, TOKEN)) as client:
        answer = client.get("/readyz")
    assert answer.status_code == 503
    assert answer.json()["ready"] is False
    assert answer.json()["upstreams"]["broker"].startswith("unreachable")


def test_get_status(stack):
    client, broker_u, learner_u = stack
    body = client.get("/v1/status").json()
    assert body["state"] == "running"
    assert body["policy_version_lag"] == 1  # learner at 4, broker samples with 3
    assert body["settings"] == {
        "alpha": 0.5,
        "t_max": 200,
        "samples_per_iteration": 256,
        "alpha_auto": False,
        "mode": "fast",
        "mode_auto": False,
    }
    assert body["pending_settings"] is None
    assert body["simulators"][0]["address"] == "127.0.0.1:7001"
    last = body["last_metrics"]
    assert last["iteration"] == 3 and last["effective_throughput"] == 1234.5
    assert last["learner"]["explained_variance"] is None  # NaN is null, never invalid JSON
    assert last["episode_returns"] == [1.5, None]
    assert last["episode_return_mean"] is None  # unset optional
    assert last["closed_loop"] == {"collided": 0.25}
    assert body["learner"]["hyperparameters"] == {"learning_rate": 3e-4, "ent_coef": 0.0}
    # One broker and one learner: the fields above as ever, and lists of one (tests/test_gateway_ranks.py: two).
    assert [(b["name"], b["up"]) for b in body["brokers"]] == [("broker", True)]
    assert [(r["name"], r["rank"]) for r in body["ranks"]] == [("learner", 0)]
    assert body["totals"]["brokers_answered"] == body["totals"]["ranks_answered"] == 1
    # The gateway shows the run's token to both services.
    assert broker_u.tokens == learner_u.tokens == {f"Bearer {TOKEN}"}


def test_get_status_broker_down_names_it(stack):
    client, broker_u, _ = stack
    broker_u.fail = grpc.StatusCode.UNAVAILABLE
    broker_u.fail_details = "x" * 5_000  # under gRPC's 8 KiB metadata limit
    answer = client.get("/v1/status")
    assert answer.status_code == 503
    body = answer.json()
    assert body["upstream"] == "broker" and body["detail"].startswith("broker at 127.0.0.1:")
    assert len(body["detail"]) < 600  # the upstream's details are relayed bounded


def test_get_status_nothing_listening():
    settings = GatewaySettings(broker=f"127.0.0.1:{_free_port()}", learner=f"127.0.0.1:{_free_port()}", deadline_s=1)
    with TestClient(create_app(settings, TOKEN)) as client:
        began = time.monotonic()
        answer = client.get("/v1/status")
    assert answer.status_code == 503
    assert "is unavailable" in answer.json()["detail"]
    assert time.monotonic() - began < 30  # bounded by the deadline, never a hang


def test_get_status_slow_upstream_is_504(stack):
    client, _, learner_u = stack
    learner_u.delay_s = 1.5  # past the 1 s deadline
    answer = client.get("/v1/status")
    assert answer.status_code == 504
    assert answer.json()["detail"].endswith("did not answer within 1 s")


def test_get_metrics_history(stack):
    client, broker_u, _ = stack
    body = client.get("/v1/metrics/history", params={"since": 1, "limit": 50}).json()
    assert [m["iteration"] for m in body] == [2, 3]
    request = broker_u.calls[-1][1]
    assert (request.since_iteration, request.max_count) == (1, 50)


@pytest.mark.parametrize("query", [{"since": -1}, {"limit": 0}, {"limit": 1001}, {"since": "abc"}])
def test_get_metrics_history_bad_query(stack, query):
    client, _, _ = stack
    answer = client.get("/v1/metrics/history", params=query)
    assert answer.status_code == 422
    assert next(iter(query)) in answer.json()["detail"]


def test_get_events_streams_iterations_then_end(stack):
    client, _, _ = stack
    with client.stream("GET", "/v1/events", params={"since": 1}) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        text = "".join(answer.iter_text())
    events = [block for block in text.split("\n\n") if block.startswith("id:") or block.startswith("event:")]
    assert events[0].startswith("id: 2\nevent: iteration\ndata: {")
    assert events[1].startswith("id: 3\n")
    assert events[-1] == "event: end\ndata: {}"


def test_get_events_resumes_after_last_event_id(stack):
    client, broker_u, _ = stack
    with client.stream("GET", "/v1/events", headers={"Last-Event-ID": "2"}) as answer:
        text = "".join(answer.iter_text())
    assert "id: 2\n" not in text and "id: 3\n" in text


def test_get_metrics_prometheus(stack):
    client, _, _ = stack
    answer = client.get("/metrics")
    assert answer.status_code == 200
    text = answer.text
    assert 'fast_upstream_up{service="broker"} 1.0' in text
    assert 'fast_run_state{state="running"} 1.0' in text
    assert "fast_effective_throughput 1234.5" in text
    assert 'fast_episode_length_bucket{le="10.0"} 1.0' in text
    assert 'fast_episode_length_bucket{le="+Inf"} 2.0' in text
    assert 'fast_simulator_step_latency_seconds{address="127.0.0.1:7001"} 0.002' in text
    assert "fast_policy_version_lag 1.0" in text
    assert 'fast_setting_mode{auto="false",mode="fast"} 1.0' in text


def test_get_metrics_prometheus_half_down(stack):
    client, _, learner_u = stack
    learner_u.fail = grpc.StatusCode.UNAVAILABLE
    text = client.get("/metrics").text
    assert 'fast_upstream_up{service="learner"} 0.0' in text
    assert "fast_iteration 3.0" in text  # the broker's half still shows


def test_get_checkpoints_and_policy(stack):
    client, _, learner_u = stack
    assert client.get("/v1/checkpoints").json()[0]["policy_version"] == 4
    answer = client.get("/v1/policy", params={"format": "onnx"})
    assert answer.status_code == 200 and answer.content == b"model-bytes"
    assert answer.headers["content-disposition"] == 'attachment; filename="fast-policy-v4.onnx"'
    assert learner_u.calls[-1][1].format == learner_pb2.POLICY_FORMAT_ONNX
    assert client.get("/v1/policy", params={"format": "pickle"}).status_code == 422


def test_get_dashboard(stack):
    client, _, _ = stack
    page = client.get("/")
    assert page.status_code == 200 and "<canvas" in page.text
    assert client.get("/static/dashboard.js").status_code == 200
    assert client.get("/static/../app.py").status_code == 404


def test_openapi_lists_every_route(stack):
    client, _, _ = stack
    paths = set(client.get("/openapi.json").json()["paths"])
    assert {
        "/healthz",
        "/readyz",
        "/v1/status",
        "/v1/metrics/history",
        "/v1/events",
        "/v1/run/pause",
        "/v1/run/resume",
        "/v1/run/stop",
        "/v1/config",
        "/v1/simulators",
        "/v1/simulators/{address}",
        "/v1/checkpoints",
        "/v1/policy",
        "/metrics",
    } <= paths


# -- writes need the token ------------------------------------------------------------------------

MUTATING = [
    ("POST", "/v1/run/pause", None),
    ("POST", "/v1/run/resume", None),
    ("POST", "/v1/run/stop", None),
    ("PATCH", "/v1/config", {"alpha": 0.3}),
    ("POST", "/v1/simulators", {"address": "127.0.0.1:7002"}),
    ("DELETE", "/v1/simulators/127.0.0.1:7001", None),
    ("POST", "/v1/checkpoints", None),
]


@pytest.mark.parametrize("method,path,body", MUTATING)
def test_mutating_call_without_token_is_401(stack, method, path, body):
    client, broker_u, learner_u = stack
    answer = client.request(method, path, json=body)
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == "Bearer"
    assert broker_u.calls == learner_u.calls == []  # nothing reached the services


@pytest.mark.parametrize("method,path,body", MUTATING)
def test_mutating_call_with_wrong_token_is_403(stack, method, path, body):
    client, broker_u, learner_u = stack
    answer = client.request(method, path, json=body, headers={"Authorization": "Bearer not-the-token"})
    assert answer.status_code == 403
    assert broker_u.calls == learner_u.calls == []


def test_post_pause(stack):
    client, broker_u, _ = stack
    answer = client.post("/v1/run/pause", headers=AUTH)
    assert answer.status_code == 200 and answer.json()["state"] == "paused"
    assert [(b["name"], b["applied"]) for b in answer.json()["brokers"]] == [("broker", True)]
    assert broker_u.calls[-1][1].action == broker_pb2.CONTROL_ACTION_PAUSE


def test_post_stop_refused_by_broker_is_409(stack):
    client, broker_u, _ = stack
    broker_u.fail, broker_u.fail_details = grpc.StatusCode.FAILED_PRECONDITION, "the run is done; nothing to pause"
    answer = client.post("/v1/run/pause", headers=AUTH)
    assert answer.status_code == 409
    assert answer.json()["detail"] == "broker: the run is done; nothing to pause"


def test_patch_config_splits_between_services(stack):
    client, broker_u, learner_u = stack
    answer = client.patch("/v1/config", json={"alpha": 0.3, "learning_rate": 1e-4}, headers=AUTH)
    assert answer.status_code == 200
    body = answer.json()
    assert body["broker"]["effective_iteration"] == 4 and body["broker"]["settings"]["alpha"] == 0.3
    assert body["learner"]["effective_from_version"] == 5
    broker_request = broker_u.calls[-1][1]
    assert broker_request.HasField("alpha") and not broker_request.HasField("t_max")
    assert learner_u.calls[-1][1].learning_rate == 1e-4


def test_patch_config_broker_only(stack):
    client, _, learner_u = stack
    body = client.patch("/v1/config", json={"t_max": 50}, headers=AUTH).json()
    assert body["learner"] is None
    assert learner_u.calls == []


def test_patch_config_alpha_auto_turns_choosing_on(stack):
    client, broker_u, _ = stack
    assert client.patch("/v1/config", json={"alpha": "auto"}, headers=AUTH).status_code == 200
    broker_request = broker_u.calls[-1][1]
    assert broker_request.HasField("alpha_auto") and broker_request.alpha_auto
    assert not broker_request.HasField("alpha")


@pytest.mark.parametrize(
    "body,field",
    [
        ({"alpha": 0}, "alpha"),
        ({"alpha": 1.5}, "alpha"),
        ({"t_max": 0}, "t_max"),
        ({"samples_per_iteration": 10**9}, "samples_per_iteration"),
        ({"learning_rate": -1}, "learning_rate"),
        ({"ent_coef": 2}, "ent_coef"),
        ({"alpha": "high"}, "alpha"),
        ({"gamma": 0.9}, "gamma"),
        ({}, "body"),
    ],
)
def test_patch_config_bad_body_is_422_naming_field(stack, body, field):
    client, broker_u, learner_u = stack
    answer = client.patch("/v1/config", json=body, headers=AUTH)
    assert answer.status_code == 422
    assert field in answer.json()["detail"]
    assert broker_u.calls == learner_u.calls == []


def test_patch_config_not_json_is_422(stack):
    client, _, _ = stack
    answer = client.patch("/v1/config", content=b"{not json", headers={**AUTH, "Content-Type": "application/json"})
    assert answer.status_code == 422


def test_body_over_limit_is_413(stack):
    client, _, _ = stack
    answer = client.post("/v1/simulators", json={"address": "a" * 10_000}, headers=AUTH)
    assert answer.status_code == 413


def test_error_does_not_echo_long_input(stack):
    client, _, _ = stack
    answer = client.post("/v1/simulators", json={"address": "b" * 3000}, headers=AUTH)
    assert answer.status_code == 422
    assert "b" * 100 not in answer.text


def test_post_simulator(stack):
    client, broker_u, _ = stack
    answer = client.post("/v1/simulators", json={"address": "127.0.0.1:7002"}, headers=AUTH)
    assert answer.status_code == 201
    assert answer.json()["num_slots"] == 5
    assert broker_u.calls[-1][1].address == "127.0.0.1:7002"


def test_post_simulator_that_does_not_answer_is_422(stack):
    client, _, _ = stack
    answer = client.post("/v1/simulators", json={"address": "127.0.0.1:1"}, headers=AUTH)
    assert answer.status_code == 422
    assert answer.json()["detail"] == "address: simulator '127.0.0.1:1' did not answer Describe: refused"


def test_post_simulator_broker_down_is_503(stack):
    client, broker_u, _ = stack
    broker_u.fail = grpc.StatusCode.UNAVAILABLE
    answer = client.post("/v1/simulators", json={"address": "127.0.0.1:7002"}, headers=AUTH)
    assert answer.status_code == 503 and answer.json()["upstream"] == "broker"


def test_delete_simulator_unknown_is_404(stack):
    client, _, _ = stack
    answer = client.delete("/v1/simulators/127.0.0.1:9999", headers=AUTH)
    assert answer.status_code == 404
    assert "not attached" in answer.json()["detail"]


def test_delete_simulator(stack):
    client, _, _ = stack
    answer = client.delete("/v1/simulators/127.0.0.1:7001", headers=AUTH)
    assert answer.status_code == 202 and answer.json()["num_slots"] == 10


def test_post_checkpoint(stack):
    client, _, _ = stack
    answer = client.post("/v1/checkpoints", headers=AUTH)
    assert answer.status_code == 201 and answer.json() == {"path": "/c/v4.pt", "policy_version": 4}


def test_upstream_refusing_gateway_token_is_502(stack):
    client, broker_u, _ = stack
    broker_u.fail = grpc.StatusCode.UNAUTHENTICATED
    answer = client.post("/v1/run/resume", headers=AUTH)
    assert answer.status_code == 502
    assert "refused the gateway's run token" in answer.json()["detail"]


def test_cors_closed_by_default(stack):
    client, _, _ = stack
    answer = client.options(
        "/v1/run/pause", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
    )
    assert "access-control-allow-origin" not in answer.headers


def test_settings_refuse_wildcard_cors():
    with pytest.raises(ValueError, match="any web page"):
        GatewaySettings(broker="a:1", learner="b:2", cors_origins="*")


def test_patch_config_mode_goes_to_update_settings_as_given(stack):
    client, broker_u, _ = stack
    for mode in ("ver", "auto"):
        assert client.patch("/v1/config", json={"mode": mode}, headers=AUTH).status_code == 200
        broker_request = broker_u.calls[-1][1]
        assert broker_request.HasField("mode") and broker_request.mode == mode
    refused = client.patch("/v1/config", json={"mode": "turbo"}, headers=AUTH)
    assert refused.status_code == 422 and "mode" in refused.text

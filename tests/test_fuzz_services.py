"""Fuzzing every RPC of the three services with random and malformed requests, as a client
generated from the protos alone could send them: wrong shapes and dtypes, huge and negative
dimensions, NaN and inf, unknown enum values, empty and repeated ids, oversized strings.

Each answer must be OK or a documented status, never UNKNOWN or INTERNAL, with details of bounded
length; and the service must still answer a good request afterwards. One real process per
service for the whole module (started as a user starts it), not one per example; each test is
bounded (max_examples, no per-example deadline: the machine may be loaded).

Messages are built valid at the protobuf level: bytes that do not parse as the request message
are refused by gRPC itself before any FAST code runs.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from conftest import stub_for
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fast import tensor
from fast.addresses import split_host_port
from fast.spaces import SpaceSpec, space_to_proto
from fast.v1 import broker_pb2 as bpb
from fast.v1 import broker_pb2_grpc, learner_pb2_grpc, simulator_pb2_grpc
from fast.v1 import learner_pb2 as lpb
from fast.v1 import simulator_pb2 as spb
from fast.v1 import tensor_pb2 as tpb
from jobs.processes import ServiceProcess, start_service
from learner.wire import BATCH_TENSOR_FIELDS, batch_to_proto

FUZZ = settings(
    max_examples=40,
    deadline=None,
    database=None,  # nothing written into the repository
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
NEVER = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
DETAILS_LIMIT = 1000  # no error quotes its input whole
INT64 = st.integers(-(2**63), 2**63 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
SLOTS = 8


def call(method, request, allowed: set[grpc.StatusCode], timeout: float = 30):
    """`method(request)`; the response, or None when refused with one of `allowed` codes (checked)."""
    try:
        response = method(request, timeout=timeout)
    except grpc.RpcError as error:
        code, details = error.code(), error.details() or ""
        event(f"{code.name}: {details[:40]}")  # pytest --hypothesis-show-statistics lists what was hit
        assert code not in NEVER, f"{code.name}: {details}"
        assert code in allowed, f"{code.name} is not documented here: {details}"
        assert len(details) < DETAILS_LIMIT, f"{len(details)} characters of details: {details[:200]}..."
        return None
    event("OK")
    return response


# -- strategies ------------------------------------------------------------------------------------

DTYPE_CODES = st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 99, 2**31 - 1, -1])
ITEMSIZE = {1: 4, 2: 8, 3: 4, 4: 8, 5: 1, 6: 1}
SHAPES = st.one_of(
    st.lists(st.integers(0, 5), max_size=4),  # small, decodable when the data fits
    st.lists(INT64, min_size=1, max_size=4),  # anything an int64 holds, negative included
    st.lists(st.sampled_from([2**31, 2**62, 2**63 - 1, -1, -(2**63)]), min_size=1, max_size=3),  # absurd
    st.lists(st.just(1), min_size=33, max_size=40),  # too many dimensions
    st.lists(st.sampled_from([0, 2**30, 2**31 - 1]), min_size=2, max_size=5),  # zero size, absurd rest
)


@st.composite
def tensors(draw, shape=SHAPES, dtype=DTYPE_CODES) -> tpb.Tensor:
    """A Tensor message: its bytes fit its shape and dtype half the time (random bytes: NaN, inf,
    BOOL bytes above 1), else arbitrary."""
    code, dims = draw(dtype), draw(shape)
    count = math.prod(dims) if all(d >= 0 for d in dims) else -1
    if code in ITEMSIZE and 0 <= count <= 256 and draw(st.booleans()):
        size = count * ITEMSIZE[code]
        data = draw(st.binary(min_size=size, max_size=size))
    else:
        data = draw(st.binary(max_size=64))
    return tpb.Tensor(dtype=code, shape=dims, data=data)


def float_array(shape: tuple[int, ...], dtype=np.float32):
    values = st.one_of(st.floats(-2, 2), st.sampled_from([np.nan, np.inf, -np.inf, 3e38, -3e38, 0.0]))
    size = math.prod(shape)
    return st.lists(values, min_size=size, max_size=size).map(lambda v: np.array(v, dtype).reshape(shape))


# -- the simulator ---------------------------------------------------------------------------------

SIM_ALLOWED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
}
SLOT_IDS = st.lists(st.one_of(st.integers(-2, SLOTS + 1), INT32), max_size=10)


@pytest.fixture(scope="module")
def sim_stub(takeover_server: ServiceProcess) -> Iterator[simulator_pb2_grpc.SimulatorStub]:
    with stub_for(takeover_server.address) as stub:
        yield stub


def _sim_still_serves(stub) -> None:
    """A good Reset and Step of the last slot (any state: Reset takes it)."""
    stub.Reset(spb.ResetRequest(slot_ids=[SLOTS - 1], clip_ids=[0]), timeout=30)
    reply = stub.Step(
        spb.StepRequest(slot_ids=[SLOTS - 1], actions=tensor.to_proto(np.zeros((1, 2), np.float32))), timeout=30
    )
    assert list(reply.slot_ids) == [SLOTS - 1]


@st.composite
def step_requests(draw) -> spb.StepRequest:
    slots = draw(st.one_of(st.lists(st.integers(0, SLOTS - 1), min_size=1, max_size=4, unique=True), SLOT_IDS))
    actions = draw(
        st.one_of(
            tensors(),
            float_array((len(slots), 2)).map(tensor.to_proto),  # the right shape, any values
            float_array((len(slots), 2), np.float64).map(tensor.to_proto),  # the right shape, another dtype
        )
    )
    return spb.StepRequest(slot_ids=slots, actions=actions, request_id=draw(INT64))


@FUZZ
@given(
    slots=st.one_of(st.lists(st.integers(0, SLOTS - 1), min_size=1, max_size=SLOTS, unique=True), SLOT_IDS),
    clips=st.lists(st.one_of(st.integers(-1, 3), INT64), max_size=10),
    seeds=st.one_of(st.just([]), st.lists(INT64, max_size=10)),
)
def test_fuzz_simulator_reset(sim_stub, slots, clips, seeds) -> None:
    # Most draws are malformed; give the well-formed ones a fair share too.
    if len(clips) < len(slots):
        clips = (clips + [0] * len(slots))[: len(slots)]
    reply = call(sim_stub.Reset, spb.ResetRequest(slot_ids=slots, clip_ids=clips, seeds=seeds), SIM_ALLOWED)
    if reply is not None:
        assert list(reply.slot_ids) == slots and tuple(reply.observations.shape)[0] == len(slots)
    _sim_still_serves(sim_stub)


@FUZZ
@given(request=step_requests(), reset_first=st.booleans())
def test_fuzz_simulator_step(sim_stub, request, reset_first: bool) -> None:
    if reset_first:  # so that well-formed steps of live slots happen, not only refusals
        sim_stub.Reset(spb.ResetRequest(slot_ids=range(SLOTS), clip_ids=[0] * SLOTS), timeout=30)
    reply = call(sim_stub.Step, request, SIM_ALLOWED)
    if reply is not None:
        assert list(reply.slot_ids) == list(request.slot_ids) and reply.request_id == request.request_id
    _sim_still_serves(sim_stub)


def test_impossible_shapes_answer_invalid_argument(sim_stub) -> None:
    """[2**62, 4] with no data used to wrap around to 0 elements and fail in numpy (UNKNOWN)."""
    sim_stub.Reset(spb.ResetRequest(slot_ids=[0], clip_ids=[0]), timeout=30)
    for shape in ([2**62, 4], [-1, 2], [2**31, 2**31, 2**31, 0], [1] * 40):
        actions = tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=shape, data=b"")
        for method in (sim_stub.Step, lambda r, timeout: next(iter(sim_stub.StepStream(iter([r]), timeout=timeout)))):
            with pytest.raises(grpc.RpcError) as refused:
                method(spb.StepRequest(slot_ids=[0], actions=actions), timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
            assert refused.value.details().startswith("actions") and len(refused.value.details()) < 300
    _sim_still_serves(sim_stub)


@settings(FUZZ, max_examples=25)
@given(requests=st.lists(step_requests(), min_size=1, max_size=3))
def test_fuzz_simulator_step_stream(sim_stub, requests) -> None:
    sim_stub.Reset(spb.ResetRequest(slot_ids=range(SLOTS), clip_ids=[0] * SLOTS), timeout=30)
    answered = 0
    try:
        for reply in sim_stub.StepStream(iter(requests), timeout=30):
            assert reply.request_id == requests[answered].request_id  # in order, one per request
            answered += 1
    except grpc.RpcError as error:  # the first refusal ends the stream with its status
        assert error.code() in SIM_ALLOWED, f"{error.code().name}: {error.details()}"
        assert len(error.details() or "") < DETAILS_LIMIT
    _sim_still_serves(sim_stub)


# -- the learner -----------------------------------------------------------------------------------

OBS = SpaceSpec("box", (5,), np.dtype(np.float32), np.full(5, -10, np.float32), np.full(5, 10, np.float32))
ACT = SpaceSpec("box", (2,), np.dtype(np.float32), -np.ones(2, np.float32), np.ones(2, np.float32))
LEARNER_ALLOWED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}
STEPS, BATCH_SLOTS = 4, 2


@pytest.fixture(scope="module")
def learner_stub(tmp_path_factory) -> Iterator[learner_pb2_grpc.LearnerStub]:
    args = ["learner", "--port", "0", "--checkpoint-dir", str(tmp_path_factory.mktemp("fuzz-ckpt"))]
    service = start_service("learner", [*args, "--update-epochs", "1", "--num-minibatches", "1"])
    try:
        with stub_for(service.address, learner_pb2_grpc.LearnerStub) as stub:
            stub.Initialize(_good_initialize(), timeout=30)
            yield stub
    finally:
        service.stop()


def _good_initialize() -> lpb.InitializeRequest:
    return lpb.InitializeRequest(observation_space=space_to_proto(OBS), action_space=space_to_proto(ACT))


def _good_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    truncated = np.zeros((STEPS, BATCH_SLOTS), bool)
    truncated[-1] = True
    return {
        "obs": rng.normal(size=(STEPS, BATCH_SLOTS, 5)).astype(np.float32),
        "actions": rng.uniform(-1, 1, size=(STEPS, BATCH_SLOTS, 2)).astype(np.float32),
        "logprobs": np.full((STEPS, BATCH_SLOTS), -2.0, np.float32),
        "values": np.zeros((STEPS, BATCH_SLOTS), np.float32),
        "rewards": rng.normal(size=(STEPS, BATCH_SLOTS)).astype(np.float32),
        "terminated": np.zeros((STEPS, BATCH_SLOTS), bool),
        "truncated": truncated,
        "valid_mask": np.ones((STEPS, BATCH_SLOTS), bool),
        "bootstrap_values": np.zeros((STEPS, BATCH_SLOTS), np.float32),
    }


def _learner_still_serves(stub) -> int:
    """The learner answers Initialize with its spaces, GetPolicy and GetStatus; returns its version."""
    assert stub.Initialize(_good_initialize(), timeout=30).resumed
    version = stub.GetStatus(lpb.GetStatusRequest(), timeout=30).policy_version
    assert stub.GetPolicy(lpb.GetPolicyRequest(known_version=-1), timeout=30).policy.version == version
    return version


@st.composite
def random_spaces(draw) -> tpb.Space:
    """Any kind, shape, dtype, n and bounds."""
    kind = draw(st.sampled_from([tpb.SPACE_KIND_BOX, tpb.SPACE_KIND_DISCRETE, 0, 3, 2**31 - 1]))
    message = tpb.Space(kind=kind, shape=draw(SHAPES), dtype=draw(DTYPE_CODES), n=draw(INT64))
    for name in ("low", "high"):
        if draw(st.booleans()):
            getattr(message, name).CopyFrom(draw(tensors()))
    return message


@st.composite
def plausible_boxes(draw) -> tpb.Space:
    """Float boxes whose bounds have the declared shape and dtype: their values decide (NaN, inf,
    low > high), or their size (1.1 M elements: a policy too large to build, bounds of 4-9 MB)."""
    dims = draw(st.one_of(st.lists(st.integers(1, 6), min_size=1, max_size=3), st.just([1100, 1000])))
    np_dtype = draw(st.sampled_from([np.float32, np.float64]))
    message = tpb.Space(kind=tpb.SPACE_KIND_BOX, shape=dims, dtype=tensor.dtype_to_proto(np_dtype))
    if math.prod(dims) > 256:  # valid bounds, too many elements to draw one by one
        low, high = np.full(dims, -1, np_dtype), np.full(dims, 1, np_dtype)
    else:
        low, high = draw(float_array(tuple(dims), np_dtype)), draw(float_array(tuple(dims), np_dtype))
    message.low.CopyFrom(tensor.to_proto(low))
    message.high.CopyFrom(tensor.to_proto(high))
    return message


SPACES = st.one_of(
    st.none(),  # the field left unset
    random_spaces(),
    plausible_boxes(),
    st.builds(tpb.Space, kind=st.just(tpb.SPACE_KIND_DISCRETE), n=st.one_of(st.integers(-2, 8), INT64)),
    st.just(space_to_proto(OBS)),
    st.just(space_to_proto(ACT)),
)


@FUZZ
@given(observation_space=SPACES, action_space=SPACES)
def test_fuzz_learner_initialize(learner_stub, observation_space, action_space) -> None:
    request = lpb.InitializeRequest()
    if observation_space is not None:
        request.observation_space.CopyFrom(observation_space)
    if action_space is not None:
        request.action_space.CopyFrom(action_space)
    call(learner_stub.Initialize, request, LEARNER_ALLOWED)
    _learner_still_serves(learner_stub)


@st.composite
def batch_mutations(draw) -> list[tuple[str, str, object]]:
    """1 to 3 changes to a good batch: (what, field, value)."""
    change = st.one_of(
        st.tuples(st.just("replace"), st.sampled_from(BATCH_TENSOR_FIELDS), tensors()),
        st.tuples(st.just("clear"), st.sampled_from(BATCH_TENSOR_FIELDS), st.none()),
        st.tuples(
            st.just("poison"),
            st.sampled_from(("obs", "actions", "logprobs", "values", "rewards", "bootstrap_values")),
            st.sampled_from([np.nan, np.inf, -np.inf, 3e38]),
        ),
        st.tuples(st.just("dtype"), st.sampled_from(BATCH_TENSOR_FIELDS), DTYPE_CODES),
        st.tuples(st.just("version"), st.just(""), INT64),
    )
    return draw(st.lists(change, min_size=1, max_size=3))


@FUZZ
@given(mutations=batch_mutations(), return_policy=st.booleans())
def test_fuzz_learner_submit_batch(learner_stub, mutations, return_policy: bool) -> None:
    version = _learner_still_serves(learner_stub)
    arrays = _good_arrays()
    for what, name, value in mutations:
        if what == "poison":  # one element of a valid step
            arrays[name] = arrays[name].copy()
            arrays[name].reshape(-1)[1] = value
    batch = batch_to_proto(arrays, version)
    for what, name, value in mutations:
        if what == "replace":
            getattr(batch, name).CopyFrom(value)
        elif what == "clear":
            batch.ClearField(name)
        elif what == "dtype":
            getattr(batch, name).dtype = value
        elif what == "version":
            batch.policy_version = value
    request = lpb.SubmitBatchRequest(batch=batch, return_policy=return_policy)
    reply = call(learner_stub.SubmitBatch, request, LEARNER_ALLOWED)
    if reply is not None:  # the changes happened to leave it valid (NaN in a step never read, ...)
        assert reply.policy_version == version + 1 and reply.HasField("policy") == return_policy
    _learner_still_serves(learner_stub)


@settings(FUZZ, max_examples=20)
@given(known_version=INT64)
def test_fuzz_learner_get_policy_and_the_rest(learner_stub, known_version: int) -> None:
    policy = learner_stub.GetPolicy(lpb.GetPolicyRequest(known_version=known_version), timeout=30).policy
    assert policy.version >= 0
    call(learner_stub.SubmitBatch, lpb.SubmitBatchRequest(), LEARNER_ALLOWED)  # no batch at all
    _learner_still_serves(learner_stub)


MAYBE_FLOAT = st.one_of(st.none(), st.floats(), st.floats(-2, 2))


@settings(FUZZ, max_examples=30)
@given(learning_rate=MAYBE_FLOAT, ent_coef=MAYBE_FLOAT)
def test_fuzz_learner_update_hyperparameters(learner_stub, learning_rate, ent_coef) -> None:
    request = lpb.UpdateHyperparametersRequest(learning_rate=learning_rate, ent_coef=ent_coef)
    reply = call(learner_stub.UpdateHyperparameters, request, {grpc.StatusCode.INVALID_ARGUMENT})
    valid = (
        (learning_rate is not None or ent_coef is not None)
        and (learning_rate is None or 0 < learning_rate <= 1)
        and (ent_coef is None or 0 <= ent_coef <= 1)
    )
    assert (reply is not None) == valid, (learning_rate, ent_coef)
    # Back to the defaults, so that the tests after this one learn as usual.
    learner_stub.UpdateHyperparameters(lpb.UpdateHyperparametersRequest(learning_rate=3e-4, ent_coef=0.0), timeout=30)
    _learner_still_serves(learner_stub)


@settings(FUZZ, max_examples=15)
@given(policy_format=st.one_of(st.sampled_from([0, 1, 2]), st.integers(3, 2**31 - 1), st.integers(-(2**31), -1)))
def test_fuzz_learner_export_and_list(learner_stub, policy_format: int) -> None:
    reply = call(learner_stub.ExportPolicy, lpb.ExportPolicyRequest(format=policy_format), LEARNER_ALLOWED)
    assert (reply is not None) == (policy_format in (1, 2))
    if reply is not None:
        assert reply.model and reply.policy_version >= 0
    listed = learner_stub.ListCheckpoints(lpb.ListCheckpointsRequest(), timeout=30).checkpoints
    assert [c.policy_version for c in listed] == sorted((c.policy_version for c in listed), reverse=True)
    _learner_still_serves(learner_stub)


def test_learner_learns_and_checkpoints_after_the_fuzzing(learner_stub) -> None:
    version = _learner_still_serves(learner_stub)
    reply = learner_stub.SubmitBatch(
        lpb.SubmitBatchRequest(batch=batch_to_proto(_good_arrays(seed=5), version)), timeout=60
    )
    assert reply.policy_version == version + 1
    saved = learner_stub.SaveCheckpoint(lpb.SaveCheckpointRequest(), timeout=60)
    assert saved.policy_version == version + 1


# -- the broker ------------------------------------------------------------------------------------

BROKER_ALLOWED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.FAILED_PRECONDITION,
}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def broker_stub(takeover_server: ServiceProcess) -> Iterator[broker_pb2_grpc.BrokerStub]:
    """A broker whose learner never answers: its run stays STARTING (it waits an hour for it), so
    the control API is up for the whole module and no CPU goes to training."""
    service = start_service(
        "broker",
        [
            "broker",
            "--simulators",
            takeover_server.address,
            "--learner",
            f"127.0.0.1:{_closed_port()}",
            "--port",
            "0",
        ],
        env={"FAST_BROKER_STARTUP_TIMEOUT_S": "3600"},
    )
    try:
        with stub_for(service.address, broker_pb2_grpc.BrokerStub) as stub:
            yield stub
    finally:
        service.kill()  # SIGTERM would wait out the grace period: its run is still starting


def _broker_still_serves(stub) -> None:
    status = stub.GetRunStatus(bpb.GetRunStatusRequest(), timeout=30)
    assert status.state == bpb.RUN_STATE_STARTING and status.mode == "fast"


def _no_dns_lookup(address: str) -> bool:
    """False for a well-formed HOST:PORT whose host is a name: dialling it asks DNS, which may take
    seconds here (that path is the UNAVAILABLE of test_broker_answers.py)."""
    try:
        host, _ = split_host_port(address)
    except ValueError:
        return True
    return host == "localhost" or ":" in host or all(c.isdigit() or c == "." for c in host)


NO_COLON = st.characters(exclude_characters=":", exclude_categories=["Cs"])  # valid UTF-8: what protobuf sends
NOT_ADDRESSES = st.one_of(
    st.text(alphabet=NO_COLON, max_size=300),  # no port at all
    st.tuples(st.text(max_size=20), st.text(max_size=8)).map(":".join).filter(_no_dns_lookup),
    st.tuples(st.sampled_from(["127.0.0.1", "localhost", "[::1]"]), st.integers(-5, 70000)).map(
        lambda hp: f"{hp[0]}:{hp[1]}"  # well formed or not, never far: refused at once
    ),
    st.text(alphabet=NO_COLON, max_size=40).map(lambda t: f"dns:///{t}"),
    st.integers(1, 10**6).map(lambda n: "x" * n + ":1"),  # oversized
)


@FUZZ
@given(address=NOT_ADDRESSES)
def test_fuzz_broker_register_simulator(broker_stub, takeover_server: ServiceProcess, address: str) -> None:
    reply = call(broker_stub.RegisterSimulator, bpb.RegisterSimulatorRequest(address=address), BROKER_ALLOWED)
    if reply is not None:  # it happened to name a live simulator
        assert reply.num_slots >= 1
    _broker_still_serves(broker_stub)
    reply = broker_stub.RegisterSimulator(bpb.RegisterSimulatorRequest(address=takeover_server.address), timeout=30)
    assert reply.num_slots == SLOTS and reply.env_id == "takeover"


@settings(FUZZ, max_examples=30)
@given(action=st.one_of(st.sampled_from([0, 1, 2]), st.integers(4, 2**31 - 1), st.integers(-(2**31), -1)))
def test_fuzz_broker_control(broker_stub, action: int) -> None:
    # CONTROL_ACTION_STOP (3) is left out: it would end the run the other examples talk to.
    reply = call(broker_stub.Control, bpb.ControlRequest(action=action), BROKER_ALLOWED)
    if reply is None:
        assert action not in (1, 2)
    else:
        assert action in (1, 2)
    _broker_still_serves(broker_stub)


@settings(FUZZ, max_examples=30)
@given(alpha=MAYBE_FLOAT, t_max=st.one_of(st.none(), INT64), samples=st.one_of(st.none(), INT64))
def test_fuzz_broker_update_settings(broker_stub, alpha, t_max, samples) -> None:
    request = bpb.UpdateSettingsRequest(alpha=alpha, t_max=t_max, samples_per_iteration=samples)
    reply = call(broker_stub.UpdateSettings, request, BROKER_ALLOWED)
    valid = (
        (alpha, t_max, samples) != (None, None, None)
        and (alpha is None or 0 < alpha <= 1)
        and (t_max is None or 1 <= t_max <= 100_000)
        and (samples is None or 1 <= samples <= 10_000_000)
    )
    assert (reply is not None) == valid, (alpha, t_max, samples)
    _broker_still_serves(broker_stub)


@settings(FUZZ, max_examples=30)
@given(address=st.one_of(NOT_ADDRESSES, st.text(max_size=50)), since=INT64, count=st.integers(-(2**31), 2**31 - 1))
def test_fuzz_broker_detach_and_history(broker_stub, address: str, since: int, count: int) -> None:
    allowed = BROKER_ALLOWED | {grpc.StatusCode.NOT_FOUND}
    reply = call(broker_stub.DetachSimulator, bpb.DetachSimulatorRequest(address=address), allowed)
    assert reply is None  # none of these is attached
    request = bpb.GetMetricsHistoryRequest(since_iteration=since, max_count=count)
    reply = call(broker_stub.GetMetricsHistory, request, BROKER_ALLOWED)
    assert (reply is None) == (count < 0)  # a negative since is "from the first"
    if reply is not None:
        assert len(reply.iterations) <= 1000
    _broker_still_serves(broker_stub)

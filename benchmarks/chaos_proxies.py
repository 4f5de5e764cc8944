"""The chaos benchmark's fault proxies: small grpc.aio servers on 127.0.0.1, one in front of each
simulator server and one in front of the learner, that forward every call as it is (the token
included) and record what went through in one Ledger.

SimulatorProxy records the transitions of every intact Step answer (by `transition_key`) and,
during a garbage window, corrupts some real answers (CORRUPTIONS); LearnerProxy checks each
SubmitBatch's valid transitions against what the simulators produced and records its outcome.
`close()` drops everything at once, like a crash; `start()` opens again on the same port.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field

import grpc
import numpy as np

from fast import tensor
from fast.tensor import TensorError
from fast.v1 import learner_pb2
from fast.v1 import simulator_pb2 as sim_pb
from fast.v1 import simulator_pb2_grpc as sim_grpc

MAX_MESSAGE_BYTES = 256 << 20
CORRUPTIONS = ("observation shape", "NaN reward", "terminated and truncated")
# The field the broker must name for each corruption (broker/answers.py).
CORRUPTION_FIELD = {
    "observation shape": "observations",
    "NaN reward": "rewards",
    "terminated and truncated": "terminated/truncated",
}


def transition_key(observation: bytes, reward, terminated) -> bytes:
    """What identifies one simulator step of one slot: the observation it was taken from, reward, terminated."""
    data = observation + np.float32(reward).tobytes() + (b"\1" if terminated else b"\0")
    return hashlib.blake2b(data, digest_size=16).digest()


@dataclass
class Ledger:
    """Everything the proxies saw in one run; times are time.monotonic()."""

    produced: set[bytes] = field(default_factory=set)  # keys of steps delivered intact
    spoiled: set[bytes] = field(default_factory=set)  # keys of real steps whose answer was corrupted
    good_steps: dict[int, list[float]] = field(default_factory=dict)  # simulator -> times of intact answers
    corrupted: list[dict] = field(default_factory=list)  # {t, sim, kind}
    batches: list[dict] = field(default_factory=list)  # one per SubmitBatch call
    learner_ok: list[float] = field(default_factory=list)  # times of answers of the learner
    describes: list[dict] = field(default_factory=list)  # {sim, t, s, ok}: the broker's readmission attempts
    faults: list[dict] = field(default_factory=list)  # what was injected, and when
    first_reset: float | None = None

    @property
    def accepted(self) -> int:
        return sum(1 for b in self.batches if b.get("outcome") == "accepted")


def _forwarded(context) -> tuple[tuple[str, str], ...]:
    """The caller's metadata the upstream needs: the run token."""
    return tuple((k, v) for k, v in context.invocation_metadata() or () if k == "authorization")


def _timeout(context) -> float | None:
    remaining = context.time_remaining()
    return remaining if remaining is not None and remaining < 1e6 else None


def _server_options() -> list[tuple[str, object]]:
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 0),
    ]


def _channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(
        address,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 500),
            ("grpc.use_local_subchannel_pool", 1),
        ],
    )


class _Proxy:
    """A grpc.aio server on 127.0.0.1 that forwards to `upstream`; closed and reopened on the same port."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.port = 0
        self._server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _handler(self) -> grpc.GenericRpcHandler:
        raise NotImplementedError

    def _connect(self, channel: grpc.aio.Channel) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        for _ in range(50):  # the old port may take a moment to be free again
            server = grpc.aio.server(options=_server_options())
            server.add_generic_rpc_handlers((self._handler(),))
            try:
                port = server.add_insecure_port(f"127.0.0.1:{self.port}")
            except RuntimeError:
                port = 0
            if port:
                break
            await server.stop(0)
            await asyncio.sleep(0.1)
        else:
            raise OSError(f"proxy cannot bind 127.0.0.1:{self.port}")
        self.port = port
        self._channel = _channel(self.upstream)
        self._connect(self._channel)
        await server.start()
        self._server = server

    async def close(self) -> None:
        """At once, like a crash: calls in flight end, connections drop, the port refuses."""
        server, channel, self._server, self._channel = self._server, self._channel, None, None
        if server is not None:
            await server.stop(0)
        if channel is not None:
            await channel.close()


class SimulatorProxy(_Proxy):
    """Forwards fast.v1.Simulator; records every Step answer; corrupts some during a garbage window."""

    def __init__(self, index: int, upstream: str, ledger: Ledger, seed: int, max_streak: int) -> None:
        super().__init__(upstream)
        self.index = index
        self.ledger = ledger
        self.rng = np.random.default_rng(seed)
        self.max_streak = max_streak  # corrupted answers in a row at most
        self.garbage_until = 0.0
        self.garbage_rate = 0.0
        self.streak = 0
        self.before: dict[int, bytes | None] = {}  # local slot -> the observation it holds, as delivered
        self._stub: sim_grpc.SimulatorStub | None = None
        ledger.good_steps.setdefault(index, [])

    def _connect(self, channel: grpc.aio.Channel) -> None:
        self._stub = sim_grpc.SimulatorStub(channel)

    def _handler(self) -> grpc.GenericRpcHandler:
        def unary(fn, request, response):
            return grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=request.FromString, response_serializer=response.SerializeToString
            )

        return grpc.method_handlers_generic_handler(
            "fast.v1.Simulator",
            {
                "Describe": unary(self._describe, sim_pb.DescribeRequest, sim_pb.DescribeResponse),
                "Reset": unary(self._reset, sim_pb.ResetRequest, sim_pb.ResetResponse),
                "Step": unary(self._step, sim_pb.StepRequest, sim_pb.StepResponse),
                "StepStream": grpc.stream_stream_rpc_method_handler(
                    self._step_stream,
                    request_deserializer=sim_pb.StepRequest.FromString,
                    response_serializer=sim_pb.StepResponse.SerializeToString,
                ),
            },
        )

    async def _unary(self, method: str, request, context):
        try:
            return await getattr(self._stub, method)(request, metadata=_forwarded(context), timeout=_timeout(context))
        except grpc.aio.AioRpcError as exc:
            await context.abort(exc.code(), exc.details() or "")

    async def _describe(self, request, context):
        started = time.monotonic()
        ok = False
        try:
            response = await self._unary("Describe", request, context)
            ok = True
            return response
        finally:
            self.ledger.describes.append({"sim": self.index, "t": started, "s": time.monotonic() - started, "ok": ok})

    async def _reset(self, request, context):
        response = await self._unary("Reset", request, context)
        try:
            observations = tensor.from_proto(response.observations, field="observations")
            for j, slot in enumerate(response.slot_ids):
                self.before[int(slot)] = np.ascontiguousarray(observations[j]).tobytes()
        except (TensorError, IndexError):
            pass  # the broker judges a bad Reset answer; nothing of it can be a valid step
        if self.ledger.first_reset is None:
            self.ledger.first_reset = time.monotonic()
        return response

    async def _step(self, request, context):
        return self._answer(await self._unary("Step", request, context))

    async def _step_stream(self, requests, context):
        call = self._stub.StepStream(metadata=_forwarded(context))
        try:
            async for request in requests:
                try:
                    await call.write(request)
                    response = await call.read()
                except grpc.aio.AioRpcError as exc:
                    await context.abort(exc.code(), exc.details() or "")
                if response is grpc.aio.EOF:
                    await context.abort(await call.code(), await call.details() or "the upstream stream ended")
                yield self._answer(response)
        finally:
            call.cancel()

    def start_garbage(self, window_s: float, rate: float) -> None:
        self.garbage_until = time.monotonic() + window_s
        self.garbage_rate = rate

    def _answer(self, response: sim_pb.StepResponse) -> sim_pb.StepResponse:
        """Record an upstream Step answer; return it as is, or corrupted during the garbage window."""
        now = time.monotonic()
        try:
            observations = tensor.from_proto(response.observations, field="observations")
            rewards = tensor.from_proto(response.rewards, field="rewards")
            terminated = tensor.from_proto(response.terminated, field="terminated")
            slots = [int(s) for s in response.slot_ids]
            keys = [
                transition_key(self.before.get(slot) or b"?", rewards[j], terminated[j]) for j, slot in enumerate(slots)
            ]
        except (TensorError, IndexError):
            return response  # not decodable: the simulator's own garbage, the broker's to refuse
        kind = None
        if now < self.garbage_until and self.streak < self.max_streak and self.rng.random() < self.garbage_rate:
            kind = CORRUPTIONS[len(self.ledger.corrupted) % len(CORRUPTIONS)]
        if kind is None:
            self.ledger.produced.update(keys)
            for j, slot in enumerate(slots):
                self.before[slot] = np.ascontiguousarray(observations[j]).tobytes()
            self.ledger.good_steps[self.index].append(now)
            self.streak = 0
            return response
        self.ledger.spoiled.update(keys)
        for slot in slots:
            self.before[slot] = None  # the broker must reset these slots before they count again
        self.streak += 1
        self.ledger.corrupted.append({"t": now, "sim": self.index, "kind": kind})
        return corrupt(response, kind, observations, self.rng)


def corrupt(response: sim_pb.StepResponse, kind: str, observations: np.ndarray, rng) -> sim_pb.StepResponse:
    bad = sim_pb.StepResponse()
    bad.CopyFrom(response)
    j = int(rng.integers(len(response.slot_ids)))
    if kind == "observation shape":
        bad.observations.CopyFrom(tensor.to_proto(np.ascontiguousarray(observations[:, :-1])))
    elif kind == "NaN reward":
        rewards = tensor.from_proto(response.rewards).copy()
        rewards[j] = np.nan
        bad.rewards.CopyFrom(tensor.to_proto(rewards))
    else:
        terminated = tensor.from_proto(response.terminated).copy()
        truncated = tensor.from_proto(response.truncated).copy()
        terminated[j] = truncated[j] = True
        bad.terminated.CopyFrom(tensor.to_proto(terminated))
        bad.truncated.CopyFrom(tensor.to_proto(truncated))
    return bad


class LearnerProxy(_Proxy):
    """Forwards fast.v1.Learner byte for byte; checks and records every SubmitBatch and its outcome."""

    METHODS = ("Initialize", "GetPolicy", "SubmitBatch", "GetStatus", "SaveCheckpoint")

    def __init__(self, upstream: str, ledger: Ledger) -> None:
        super().__init__(upstream)
        self.ledger = ledger
        self._calls: dict[str, object] = {}

    def _connect(self, channel: grpc.aio.Channel) -> None:
        self._calls = {m: channel.unary_unary(f"/fast.v1.Learner/{m}") for m in self.METHODS}

    def _handler(self) -> grpc.GenericRpcHandler:
        def forwarder(method: str):
            async def forward(request: bytes, context) -> bytes:
                record = self._check(request) if method == "SubmitBatch" else None
                try:
                    reply = await self._calls[method](request, metadata=_forwarded(context), timeout=_timeout(context))
                except grpc.aio.AioRpcError as exc:
                    if record is not None:
                        refused = exc.code() == grpc.StatusCode.FAILED_PRECONDITION and "policy_version" in (
                            exc.details() or ""
                        )
                        record["outcome"] = "refused-stale" if refused else exc.code().name
                        record["t_reply"] = time.monotonic()
                    await context.abort(exc.code(), exc.details() or "")
                except asyncio.CancelledError:
                    if record is not None:  # cut by the proxy's own close (the learner was killed)
                        record.update(outcome="CANCELLED", t_reply=time.monotonic())
                    raise
                now = time.monotonic()
                self.ledger.learner_ok.append(now)
                if record is not None:
                    answer = learner_pb2.SubmitBatchResponse.FromString(reply)
                    record.update(outcome="accepted", reply_version=int(answer.policy_version), t_reply=now)
                return reply

            return grpc.unary_unary_rpc_method_handler(forward)

        return grpc.method_handlers_generic_handler("fast.v1.Learner", {m: forwarder(m) for m in self.METHODS})

    def _check(self, request: bytes) -> dict:
        """The batch's valid transitions against what the simulators produced."""
        message = learner_pb2.SubmitBatchRequest.FromString(request).batch
        record = {"t": time.monotonic(), "version": int(message.policy_version), "outcome": "pending"}
        try:
            arrays = {
                name: tensor.from_proto(getattr(message, name), field=name)
                for name in ("obs", "actions", "logprobs", "values", "rewards", "terminated", "truncated")
            }
            arrays["valid_mask"] = tensor.from_proto(message.valid_mask, field="valid_mask").astype(bool)
            arrays["bootstrap_values"] = tensor.from_proto(message.bootstrap_values, field="bootstrap_values")
        except TensorError as exc:
            record.update(undecodable=str(exc), valid=0, unknown=0, spoiled=0, nonfinite=0, both_flags=0)
            self.ledger.batches.append(record)
            return record
        valid = arrays["valid_mask"]
        rows, slots = np.nonzero(valid)
        obs, rewards, terminated = arrays["obs"], arrays["rewards"], arrays["terminated"]
        keys = [
            transition_key(np.ascontiguousarray(obs[t, s]).tobytes(), rewards[t, s], terminated[t, s])
            for t, s in zip(rows.tolist(), slots.tolist())
        ]
        nonfinite = int((~np.isfinite(obs[valid].reshape(int(valid.sum()), -1))).any(axis=1).sum())
        for name in ("rewards", "logprobs", "values", "bootstrap_values"):
            nonfinite += int((~np.isfinite(arrays[name][valid])).sum())
        actions = arrays["actions"][valid]
        if actions.dtype.kind == "f":
            nonfinite += int((~np.isfinite(actions.reshape(actions.shape[0], -1))).any(axis=1).sum())
        digest = hashlib.blake2b(digest_size=16)
        for name in ("obs", "actions", "rewards", "valid_mask"):
            digest.update(np.ascontiguousarray(arrays[name]).tobytes())
        record.update(
            digest=digest.hexdigest(),
            valid=len(keys),
            unknown=sum(1 for k in keys if k not in self.ledger.produced),
            spoiled=sum(1 for k in keys if k in self.ledger.spoiled),
            nonfinite=nonfinite,
            both_flags=int((arrays["terminated"] & arrays["truncated"] & valid).sum()),
        )
        self.ledger.batches.append(record)
        return record

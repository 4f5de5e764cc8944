"""An asyncio client of the fast.v1 Simulator API that speaks numpy.

Used by the broker, `fast play` and the benchmarks; any other client can be generated from
protos/ alone. It imports only the bottom layer (fast.*, with the generated stubs), so a
service that uses it gets none of the simulator server's internals. Every call has a deadline
(`timeout_s`) and carries the run token (`credentials`, default the environment's; fast/auth.py);
errors surface as grpc.aio.AioRpcError.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from fast import frames, tensor
from fast.rpc import Credentials, RpcClient
from fast.spaces import SpaceSpec, space_from_proto
from fast.v1 import simulator_pb2 as pb
from fast.v1 import simulator_pb2_grpc as pb_grpc


@dataclass
class ServerDescription:
    env_id: str
    observation_space: SpaceSpec
    action_space: SpaceSpec
    num_slots: int
    num_clips: int
    cost_model: pb.CostModel
    server_version: str
    # Its Capabilities: Reset takes several slots in one call; StepStream is implemented.
    batched_reset: bool = True
    streaming_step: bool = True
    prefetch: bool = False  # Prepare is served
    local_step_socket: str = ""  # a Unix socket on the server's machine that serves Step too ("": none)
    # The map of each clip ([num_clips] int64), or empty when the server does not say.
    clip_map_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


@dataclass
class ResetReply:
    slot_ids: np.ndarray  # [k], as the server answered them
    observations: np.ndarray  # [k, *obs_shape]
    timing: pb.ServerTiming


@dataclass
class StepReply:
    """A Step response decoded, as the server sent it: shapes and contents are the caller's to
    check (the broker's pool does, broker/answers.py)."""

    slot_ids: np.ndarray  # [k]
    observations: np.ndarray  # [k, *obs_shape]
    rewards: np.ndarray  # [k] float32
    terminated: np.ndarray  # [k] bool
    truncated: np.ndarray  # [k] bool
    episodes: list[pb.EpisodeSummary] = field(default_factory=list)
    timing: pb.ServerTiming | None = None
    request_id: int = 0  # what the server echoed
    sent_request_id: int = 0  # what the request carried (0 for unary Step)


def reset_reply(response: pb.ResetResponse) -> ResetReply:
    """A Reset answer decoded (TensorError when a tensor does not decode)."""
    return ResetReply(
        slot_ids=np.asarray(response.slot_ids, dtype=np.int64),
        observations=tensor.from_proto(response.observations, field="observations"),
        timing=response.timing,
    )


def step_request(slot_ids, actions: np.ndarray, request_id: int = 0) -> pb.StepRequest:
    """A Step request, as unary Step, StepStream and the local step socket send it."""
    return pb.StepRequest(slot_ids=list(map(int, slot_ids)), actions=tensor.to_proto(actions), request_id=request_id)


def step_reply(response: pb.StepResponse, sent_request_id: int = 0) -> StepReply:
    """A Step answer decoded (TensorError when a tensor does not decode)."""
    return StepReply(
        slot_ids=np.asarray(response.slot_ids, dtype=np.int64),
        observations=tensor.from_proto(response.observations, field="observations"),
        rewards=tensor.from_proto(response.rewards, field="rewards"),
        terminated=tensor.from_proto(response.terminated, field="terminated"),
        truncated=tensor.from_proto(response.truncated, field="truncated"),
        episodes=list(response.episodes),
        timing=response.timing,
        request_id=response.request_id,
        sent_request_id=sent_request_id,
    )


def episode_summary(end) -> pb.EpisodeSummary:
    """The wire form of one episode's end (sim_server/simulator.py `EpisodeEnd`: slot_id, clip_id,
    terminated, metrics), as a Step answer carries it: the servicer's, and the broker's in-process
    pool's (broker/in_process.py), which answers as a server would without the wire."""
    return pb.EpisodeSummary(
        slot_id=end.slot_id,
        clip_id=end.clip_id,
        length=int(end.metrics.get("length", 0)),
        episode_return=float(end.metrics.get("return", 0.0)),
        terminated=end.terminated,
        metrics={k: float(v) for k, v in end.metrics.items()},
    )


class SimulatorClient(RpcClient):
    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = 30.0,
        max_message_bytes: int = 64 << 20,
        credentials: Credentials | None = None,
    ) -> None:
        credentials = credentials or Credentials.from_env()
        super().__init__(address, max_message_bytes=max_message_bytes, credentials=credentials)
        self.timeout_s = timeout_s
        self.max_message_bytes = max_message_bytes
        self._token = credentials.token
        self._stub = self.stub(pb_grpc.SimulatorStub)

    async def describe(self) -> ServerDescription:
        r = await self._stub.Describe(pb.DescribeRequest(), timeout=self.timeout_s)
        return ServerDescription(
            env_id=r.env_id,
            observation_space=space_from_proto(r.observation_space, field="observation_space"),
            action_space=space_from_proto(r.action_space, field="action_space"),
            num_slots=r.num_slots,
            num_clips=r.num_clips,
            cost_model=r.capabilities.cost_model,
            server_version=r.server_version,
            batched_reset=r.capabilities.batched_reset,
            streaming_step=r.capabilities.streaming_step,
            prefetch=r.capabilities.prefetch,
            local_step_socket=r.capabilities.local_step_socket,
            clip_map_ids=np.asarray(r.clip_map_ids, dtype=np.int64),
        )

    async def reset(self, slot_ids, clip_ids, seeds=(), *, timeout_s: float | None = None) -> ResetReply:
        """`timeout_s`: this call's deadline (None: the client's); a reset may be slower than a Describe."""
        r = await self._stub.Reset(
            pb.ResetRequest(
                slot_ids=list(map(int, slot_ids)), clip_ids=list(map(int, clip_ids)), seeds=list(map(int, seeds))
            ),
            timeout=self.timeout_s if timeout_s is None else timeout_s,
        )
        return reset_reply(r)

    async def prepare(self, slot_ids, clip_ids, seeds=(), *, timeout_s: float | None = None) -> list[int]:
        """Start preparing the slots' next clips (answered at once); the slots the server took."""
        r = await self._stub.Prepare(
            pb.PrepareRequest(
                slot_ids=list(map(int, slot_ids)), clip_ids=list(map(int, clip_ids)), seeds=list(map(int, seeds))
            ),
            timeout=self.timeout_s if timeout_s is None else timeout_s,
        )
        return list(r.slot_ids)

    async def step(self, slot_ids, actions: np.ndarray, *, timeout_s: float | None = None) -> StepReply:
        r = await self._stub.Step(
            step_request(slot_ids, actions),
            timeout=self.timeout_s if timeout_s is None else timeout_s,
        )
        return step_reply(r)

    def step_stream(self) -> "StepStream":
        return StepStream(self._stub.StepStream(timeout=None))

    async def local_step_stream(self, path: str) -> "LocalStepStream":
        """StepStream's exchange on the server's local step socket at `path` (its Describe names it);
        OSError when it cannot be opened from here (another machine), AioRpcError when refused."""
        return await LocalStepStream.open(path, self._token, max_message_bytes=self.max_message_bytes)


class StepStream:
    """The bidirectional form of Step: one request in flight, answered in order."""

    def __init__(self, call) -> None:
        self._call = call
        self._next_id = 0

    async def step(self, slot_ids, actions: np.ndarray) -> StepReply:
        self._next_id += 1
        try:
            await self._call.write(step_request(slot_ids, actions, self._next_id))
        except asyncio.InvalidStateError:
            # The stream finished before this request (e.g. the server went away between two
            # steps): grpc says only "RPC already finished"; raise the status that finished it.
            raise await self._ended() from None
        response = await self._call.read()
        if response is grpc.aio.EOF:
            raise await self._ended()
        return step_reply(response, sent_request_id=self._next_id)

    async def _ended(self) -> Exception:
        """What to raise for a stream that finished: its status as an AioRpcError (e.g. UNAVAILABLE:
        Socket closed), or a ConnectionError when the server closed it with OK."""
        code, details = await self._call.code(), await self._call.details()
        if code == grpc.StatusCode.OK:
            return ConnectionError("the step stream ended with OK before answering")
        return grpc.aio.AioRpcError(
            code,
            await self._call.initial_metadata(),
            await self._call.trailing_metadata(),
            details=details,
            debug_error_string=await self._call.debug_error_string(),
        )

    async def close(self) -> None:
        await self._call.done_writing()

    def cancel(self) -> None:
        """Abandon the stream (after a timeout its state is unknown); the server sees CANCELLED."""
        self._call.cancel()


def _status(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class LocalStepStream:
    """StepStream's exchange over the server's local step socket (sim_server/local_step.py): the
    same messages, one request in flight, answered in order; what ends it raises the AioRpcError a
    StepStream would have ended with (the server's error frame: its status; a closed socket:
    UNAVAILABLE). Opening it raises OSError where the socket is not reachable from here."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_message_bytes: int) -> None:
        self._reader, self._writer = reader, writer
        self._max = max_message_bytes
        self._next_id = 0

    @classmethod
    async def open(cls, path: str, token: str, *, max_message_bytes: int) -> "LocalStepStream":
        reader, writer = await asyncio.open_unix_connection(path, limit=1 << 16)
        stream = cls(reader, writer, max_message_bytes)
        try:
            writer.write(frames.encode(frames.HELLO, token.encode()))
            await stream._expect(frames.READY)
        except BaseException:
            stream.cancel()
            raise
        return stream

    async def step(self, slot_ids, actions: np.ndarray) -> StepReply:
        self._next_id += 1
        request = step_request(slot_ids, actions, self._next_id)
        self._writer.write(frames.encode(frames.STEP, request.SerializeToString()))
        payload = await self._expect(frames.ANSWER)
        try:
            response = pb.StepResponse.FromString(payload)
        except DecodeError:
            raise _status(
                grpc.StatusCode.INTERNAL, "the local step socket answered with something not a StepResponse"
            ) from None
        return step_reply(response, sent_request_id=self._next_id)

    async def _expect(self, kind: int) -> bytes:
        try:
            got, payload = await frames.read_frame(self._reader, self._max)
        except (asyncio.IncompleteReadError, ConnectionError):
            # What a StepStream ends with when its server goes away.
            raise _status(grpc.StatusCode.UNAVAILABLE, "the local step socket closed before answering") from None
        except frames.FrameError as exc:
            raise _status(grpc.StatusCode.INTERNAL, f"the local step socket sent a bad frame: {exc}") from None
        if got == frames.ERROR:
            code_value, message = frames.decode_error(payload)
            raise _status(
                next((c for c in grpc.StatusCode if c.value[0] == code_value), grpc.StatusCode.UNKNOWN), message
            )
        if got != kind:
            raise _status(
                grpc.StatusCode.INTERNAL, f"the local step socket sent a frame of kind {got} where {kind} was due"
            )
        return payload

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    def cancel(self) -> None:
        """Abandon the exchange (after a timeout its state is unknown): the server sees the socket close."""
        self._writer.close()

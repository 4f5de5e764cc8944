"""The server under check, as `fast sim-check` speaks to it, and the broker's verdicts on its answers.

`Target` holds one channel to the server (fast.rpc: every Simulator call carries the run token,
every call a deadline) and the helpers the checks share. Answers are decoded with fast/tensor.py
into sim_server/client.py's reply types and judged by broker/answers.py, the broker's own rules,
so sim-check passes exactly what a run's broker would accept. `step_verdicts` asks those rules
once per field, so one answer with NaN rewards and both flags set is reported for both.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import grpc
import numpy as np
from grpc_health.v1 import health_pb2_grpc

from broker import answers
from fast import tensor
from fast.quoting import shorten
from fast.rpc import Credentials, RpcClient, open_channel
from fast.spaces import SpaceSpec, random_actions
from fast.v1 import simulator_pb2 as pb
from fast.v1 import simulator_pb2_grpc as pb_grpc
from sim_server.client import ResetReply, ServerDescription, StepReply, reset_reply, step_reply

MAX_MESSAGE_BYTES = 64 << 20
OK = grpc.StatusCode.OK


@dataclasses.dataclass
class Options:
    """What a check run may do and how long it may wait."""

    timeout_s: float = 10.0  # deadline of every call
    connect_timeout_s: float = 5.0  # how long the server may take to accept the connection
    steps: int = 300  # lock-step steps of all slots in the step-semantics check
    seed: int = 0  # of the random actions, clips and seeds
    pid: int | None = None  # the server's process, for the drain check (SIGTERM)
    figure_budget_s: float = 2.0  # time spent measuring each latency figure
    semantics_budget_s: float = 20.0  # the step-semantics run stops here even short of `steps`
    drain_wait_s: float = 20.0  # how long the process may take to exit after SIGTERM


class BadAnswer(Exception):
    """An answer whose tensors do not decode; the message names the field."""


class UsageError(Exception):
    """sim-check cannot check this server at all (unreachable, wrong token, bad --pid); exit 2."""


def rpc_text(exc: grpc.aio.AioRpcError) -> str:
    return f"{exc.code().name}: {shorten(exc.details() or '(no details)', 160)}"


def decode_reset(r: pb.ResetResponse) -> ResetReply:
    """The client's decoding, with BadAnswer for tensors that do not decode and None for no timing."""
    try:
        reply = reset_reply(r)
    except tensor.TensorError as exc:
        raise BadAnswer(str(exc)) from None
    reply.timing = r.timing if r.HasField("timing") else None
    return reply


def decode_step(r: pb.StepResponse, sent_request_id: int = 0) -> StepReply:
    try:
        reply = step_reply(r, sent_request_id)
    except tensor.TensorError as exc:
        raise BadAnswer(str(exc)) from None
    reply.timing = r.timing if r.HasField("timing") else None
    return reply


# The fields of an answer that broker/answers.py judges, in the order it judges them: a message
# starts with its field ("rewards: ...", "timing.compute_s is ...").
FIELDS = ("request_id", "slot_ids", "observations", "rewards", "flags", "episodes", "timing")


def field_of(problem: str) -> str:
    head = problem.split(":", 1)[0].split(" ", 1)[0]
    if not head.startswith("timing"):
        head = head.split(".", 1)[0]  # "observations.dtype is ..." (a tensor that does not decode)
    if head in ("terminated", "truncated", "terminated/truncated"):
        return "flags"
    if head.startswith("timing"):
        return "timing"
    return head if head in FIELDS else "other"


def _neutral(reply, field: str, asked: np.ndarray, space: SpaceSpec, problem: str):
    """`reply` with `field` replaced by a value the rules accept, so the next field gets judged."""
    k = asked.size
    if field == "request_id":
        return dataclasses.replace(reply, request_id=reply.sent_request_id)
    if field == "slot_ids":
        return dataclasses.replace(reply, slot_ids=asked.copy())
    if field == "observations":
        return dataclasses.replace(reply, observations=np.zeros((k, *space.shape), dtype=space.dtype))
    if field == "rewards":
        return dataclasses.replace(reply, rewards=np.zeros(k, dtype=np.float32))
    if field == "flags" and problem.startswith("terminated/truncated"):  # both set: keep "terminated"
        return dataclasses.replace(reply, truncated=reply.truncated & ~reply.terminated)
    if field in ("flags", "episodes"):  # flags that cannot be read: nothing ended, no summaries
        none = np.zeros(k, dtype=bool)
        return dataclasses.replace(reply, terminated=none, truncated=none.copy(), episodes=[])
    if field == "timing":
        return dataclasses.replace(reply, timing=None)
    return None


def _verdicts(judge, reply, asked: np.ndarray, space: SpaceSpec) -> dict[str, str]:
    found: dict[str, str] = {}
    for _ in range(len(FIELDS) + 1):
        problem = judge(reply, asked, space)
        if not problem:
            break
        field = field_of(problem)
        if field in found:  # neutralising did not help: stop rather than loop
            break
        found[field] = problem
        reply = _neutral(reply, field, asked, space, problem)
        if reply is None:
            break
    return found


def step_verdicts(reply: StepReply, asked: np.ndarray, space: SpaceSpec) -> dict[str, str]:
    """Every field of a Step answer that broker/answers.py refuses: field -> the broker's sentence."""
    return _verdicts(answers.step_problem, reply, asked, space)


def reset_verdicts(reply: ResetReply, asked: np.ndarray, space: SpaceSpec) -> dict[str, str]:
    return _verdicts(answers.reset_problem, reply, asked, space)


def ended_mask(reply: StepReply, k: int) -> np.ndarray:
    """The slots whose episode ended, as far as the flags can be read (else none)."""
    flags = [reply.terminated, reply.truncated]
    if all(f.shape == (k,) and f.dtype.kind == "b" for f in flags):
        return flags[0] | flags[1]
    return np.zeros(k, dtype=bool)


class Target:
    """One server: a token-carrying Simulator stub, a token-free health stub, shared helpers."""

    def __init__(self, address: str, credentials: Credentials, options: Options) -> None:
        self.address = address
        self.options = options
        self.credentials = credentials
        self.client = RpcClient(address, max_message_bytes=MAX_MESSAGE_BYTES, credentials=credentials)
        self.stub = self.client.stub(pb_grpc.SimulatorStub)
        # Probes send no token (fast/auth.py leaves the health service open), so neither does this.
        self._health_channel = open_channel(address, max_message_bytes=MAX_MESSAGE_BYTES, tls=credentials.tls)
        self.health = health_pb2_grpc.HealthStub(self._health_channel)
        self.rng = np.random.default_rng(options.seed)
        self.desc: ServerDescription | None = None
        self.capabilities = pb.Capabilities()

    async def close(self) -> None:
        await self.client.close()
        await self._health_channel.close()

    @property
    def timeout(self) -> float:
        return self.options.timeout_s

    @property
    def num_slots(self) -> int:
        assert self.desc is not None
        return self.desc.num_slots

    @property
    def slots(self) -> np.ndarray:
        return np.arange(self.num_slots, dtype=np.int64)

    def actions(self, k: int) -> np.ndarray:
        assert self.desc is not None
        return random_actions(self.desc.action_space, k, self.rng)

    def clips(self, k: int) -> np.ndarray:
        assert self.desc is not None
        return self.rng.integers(0, self.desc.num_clips, size=k, dtype=np.int64)

    def seeds(self, k: int) -> np.ndarray:
        return self.rng.integers(0, 1 << 31, size=k, dtype=np.int64)

    def reset_call(self, slots, clips, seeds=(), *, timeout: float | None = None):
        request = pb.ResetRequest(
            slot_ids=[int(s) for s in slots], clip_ids=[int(c) for c in clips], seeds=[int(s) for s in seeds]
        )
        return self.stub.Reset(request, timeout=self.timeout if timeout is None else timeout)

    def step_call(self, slots, actions: np.ndarray, *, timeout: float | None = None):
        request = pb.StepRequest(slot_ids=[int(s) for s in slots], actions=tensor.to_proto(actions))
        return self.stub.Step(request, timeout=self.timeout if timeout is None else timeout)

    async def reset(self, slots, clips, seeds=(), *, timeout: float | None = None) -> ResetReply:
        """Reset and decode; grpc.aio.AioRpcError on a status, BadAnswer on tensors that do not decode.

        A server that does not advertise batched_reset gets one Reset per slot, in order, as the
        broker sends it; the answers are joined as one."""
        slots, clips, seeds = list(slots), list(clips), list(seeds)
        if len(slots) <= 1 or self.desc is None or self.capabilities.batched_reset:
            return decode_reset(await self.reset_call(slots, clips, seeds, timeout=timeout))
        replies = [
            decode_reset(await self.reset_call([slot], [clips[i]], seeds[i : i + 1], timeout=timeout))
            for i, slot in enumerate(slots)
        ]
        return ResetReply(
            slot_ids=np.concatenate([r.slot_ids for r in replies]),
            observations=np.concatenate([r.observations for r in replies]),
            timing=replies[-1].timing,
        )

    async def step(self, slots, actions: np.ndarray, *, timeout: float | None = None) -> StepReply:
        return decode_step(await self.step_call(slots, actions, timeout=timeout))

    async def status_of(self, call) -> tuple[grpc.StatusCode, str]:
        """The status a call ends with (OK when it answers) and its details."""
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
        except asyncio.CancelledError:  # a call this client cancelled (grpc.aio raises it on await)
            return grpc.StatusCode.CANCELLED, "cancelled by sim-check"
        return OK, ""

    async def serving(self) -> str:
        """ "" when Describe still answers, else what happened."""
        try:
            await self.stub.Describe(pb.DescribeRequest(), timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            return f"Describe then failed with {rpc_text(exc)}"
        return ""

    async def reset_when_free(self, slots, clips, seeds=(), *, within_s: float = 3.0) -> ResetReply:
        """Reset, retrying while the server answers FAILED_PRECONDITION (a slot still busy in a call that
        was cancelled or timed out) for up to `within_s`; the last error otherwise."""
        give_up = time.monotonic() + within_s
        while True:
            try:
                return await self.reset(slots, clips, seeds)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.FAILED_PRECONDITION or time.monotonic() > give_up:
                    raise
            await asyncio.sleep(0.05)

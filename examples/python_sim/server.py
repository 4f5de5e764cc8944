"""A standalone fast.v1 simulator server: a 2-D point mass that must reach a target.

It imports nothing of the FAST repository: only grpcio, grpcio-health-checking and the stubs that
protoc generates from protos/ into this directory (see README.md). Run it from anywhere as
`python server.py` or `python examples/python_sim/server.py`: Python puts the script's directory
first on sys.path, so the generated `fast` package here is the one imported, never the FAST
project's own `fast` package.

The environment (identical, bit for bit, to examples/node_sim/server.js):

- observation: float32 [6] = x, y, vx, vy, target_x - x, target_y - y
- action: float32 [2] in [-1, 1], an acceleration: v <- 0.9 v + 0.1 a, then p <- p + 0.1 v
- reward: 1 / (1 + 10 d^2), d the distance to the target; -1 on the step that leaves the arena
- terminated when |x| > 1 or |y| > 1; truncated after MAX_STEPS steps
- clip c: the target position, drawn from c alone; the episode seed draws the start position, so
  the same clip, seed and actions always give the same trajectory.
"""

from __future__ import annotations

import argparse
import hmac
import math
import os
import re
import signal
import struct
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

try:
    from fast.v1 import simulator_pb2 as pb
    from fast.v1 import simulator_pb2_grpc as pb_grpc
    from fast.v1 import tensor_pb2 as tpb
except ImportError as exc:  # the stubs were not generated (or only part of them)
    sys.exit(f"cannot import the generated stubs ({exc}); generate them first, see README.md")

ENV_ID = "point-mass"
SERVER_VERSION = "0.1.0 (examples/python_sim)"
SERVICE = "fast.v1.Simulator"
NUM_CLIPS = 20
MAX_STEPS = 80
OBS_LOW = [-1.1, -1.1, -1.0, -1.0, -2.0, -2.0]
OBS_HIGH = [1.1, 1.1, 1.0, 1.0, 2.0, 2.0]
ACT_DIM = 2

MASK64 = (1 << 64) - 1
MAX_DIM = (1 << 31) - 1
MAX_RANK = 32
DTYPE_SIZES = {
    tpb.DTYPE_FLOAT32: 4,
    tpb.DTYPE_FLOAT64: 8,
    tpb.DTYPE_INT32: 4,
    tpb.DTYPE_INT64: 8,
    tpb.DTYPE_BOOL: 1,
    tpb.DTYPE_UINT8: 1,
}
OPEN_METHODS = ("/grpc.health.v1.Health/", "/grpc.reflection.")


# -- the environment ------------------------------------------------------------------------------


def _splitmix64(state: int) -> tuple[int, int]:
    """One step of SplitMix64: (next state, output). Same integers in every language."""
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


class Rng:
    def __init__(self, seed: int) -> None:
        self.state = seed & MASK64

    def uniform(self, low: float, high: float) -> float:
        self.state, z = _splitmix64(self.state)
        return low + (high - low) * ((z >> 11) * 2.0**-53)


def clip_target(clip: int) -> tuple[float, float]:
    rng = Rng(clip * 0x100000001B3 + 0xC11F)
    return rng.uniform(-0.6, 0.6), rng.uniform(-0.6, 0.6)


class Slot:
    """One slot's episode: None before its first Reset, ended after the step that ended it."""

    def __init__(self, clip: int, seed: int) -> None:
        self.clip = clip
        self.tx, self.ty = clip_target(clip)
        rng = Rng(_splitmix64(clip & MASK64)[1] ^ (seed & MASK64))
        self.x, self.y = rng.uniform(-0.8, 0.8), rng.uniform(-0.8, 0.8)
        self.vx = self.vy = 0.0
        self.t = 0
        self.ret = 0.0
        self.min_d = self.distance()
        self.ended = False

    def distance2(self) -> float:
        dx, dy = self.tx - self.x, self.ty - self.y
        return dx * dx + dy * dy

    def distance(self) -> float:
        return math.sqrt(self.distance2())

    def observation(self) -> list[float]:
        return [self.x, self.y, self.vx, self.vy, self.tx - self.x, self.ty - self.y]

    def step(self, ax: float, ay: float) -> tuple[float, bool, bool]:
        """(reward, terminated, truncated), rounded to float32 as sent."""
        self.vx = 0.9 * self.vx + 0.1 * ax
        self.vy = 0.9 * self.vy + 0.1 * ay
        self.x = self.x + 0.1 * self.vx
        self.y = self.y + 0.1 * self.vy
        self.t += 1
        out = abs(self.x) > 1.0 or abs(self.y) > 1.0
        d2 = self.distance2()
        self.min_d = min(self.min_d, math.sqrt(d2))
        reward = -1.0 if out else 1.0 / (1.0 + 10.0 * d2)
        reward = struct.unpack("<f", struct.pack("<f", reward))[0]
        self.ret += reward
        self.ended = out or self.t >= MAX_STEPS
        return reward, out, self.ended and not out

    def summary(self, slot_id: int, terminated: bool) -> pb.EpisodeSummary:
        d = self.distance()
        return pb.EpisodeSummary(
            slot_id=slot_id,
            clip_id=self.clip,
            length=self.t,
            episode_return=self.ret,
            terminated=terminated,
            metrics={
                "final_distance": d,
                "min_distance": self.min_d,
                "reached": 1.0 if self.min_d < 0.1 else 0.0,
                "out_of_bounds": 1.0 if terminated else 0.0,
            },
        )


# -- tensors --------------------------------------------------------------------------------------


def f32_tensor(values: list[float], shape: list[int]) -> tpb.Tensor:
    return tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=shape, data=struct.pack(f"<{len(values)}f", *values))


def bool_tensor(values: list[bool]) -> tpb.Tensor:
    return tpb.Tensor(dtype=tpb.DTYPE_BOOL, shape=[len(values)], data=bytes(int(v) for v in values))


def quote(value: object, limit: int = 80) -> str:
    """At most `limit` characters of what a client sent, never a whole value."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Refusal(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def invalid(message: str) -> Refusal:
    return Refusal(grpc.StatusCode.INVALID_ARGUMENT, message)


def decode_tensor(t: tpb.Tensor, field: str) -> tuple[list[int], bytes]:
    """(shape, data) of a tensor that decodes; Refusal(INVALID_ARGUMENT) naming `field` otherwise."""
    size = DTYPE_SIZES.get(t.dtype)
    if size is None:
        raise invalid(f"{field}.dtype: {quote(t.dtype)} is not a known DType")
    shape = list(t.shape)
    if len(shape) > MAX_RANK:
        raise invalid(f"{field}.shape has {len(shape)} dimensions; at most {MAX_RANK}")
    if any(d < 0 or d > MAX_DIM for d in shape):
        raise invalid(f"{field}.shape {quote(shape)}: every dimension must be in 0..{MAX_DIM}")
    count = math.prod(shape)  # a Python int: exact, never wraps around
    if count * size != len(t.data):
        raise invalid(f"{field}: shape {quote(shape)} needs {count * size} bytes, data has {len(t.data)}")
    if t.dtype == tpb.DTYPE_BOOL and any(b > 1 for b in t.data):
        raise invalid(f"{field}: BOOL data holds bytes other than 0 and 1")
    return shape, t.data


def actions_of(t: tpb.Tensor, shape: list[int], data: bytes, slot_ids: list[int]) -> list[float]:
    """The actions of a decoded tensor as floats, [k * ACT_DIM], each checked against the action space."""
    k = len(slot_ids)
    if t.dtype != tpb.DTYPE_FLOAT32 or shape != [k, ACT_DIM]:
        raise invalid(
            f"actions: expected shape [{k}, {ACT_DIM}] ({k} slots x action shape [{ACT_DIM}]) of float32, "
            f"got shape {quote(shape)} of {tpb.DType.Name(t.dtype).removeprefix('DTYPE_').lower()}"
        )
    actions = list(struct.unpack(f"<{k * ACT_DIM}f", data))
    for j, s in enumerate(slot_ids):
        row = actions[j * ACT_DIM : (j + 1) * ACT_DIM]
        if not all(math.isfinite(a) for a in row):
            raise invalid(f"slot {s}: action {quote(row)} is not finite; send finite values of shape [{ACT_DIM}]")
        for e, a in enumerate(row):
            if not -1.0 <= a <= 1.0:
                raise invalid(
                    f"slot {s}: action element {e} = {a} is outside its bounds [-1.0, 1.0]; "
                    "clip actions to the action space"
                )
    return actions


# -- the service ----------------------------------------------------------------------------------


class PointMassSimulator(pb_grpc.SimulatorServicer):
    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.slots: list[Slot | None] = [None] * num_slots
        # Each call runs whole under the lock: it sees every slot as the previous call left it, and a
        # refused call has changed nothing (every check runs before the first change).
        self.lock = threading.Lock()

    def Describe(self, request, context):
        return pb.DescribeResponse(
            env_id=ENV_ID,
            observation_space=tpb.Space(
                kind=tpb.SPACE_KIND_BOX,
                shape=[len(OBS_LOW)],
                dtype=tpb.DTYPE_FLOAT32,
                low=f32_tensor(OBS_LOW, [len(OBS_LOW)]),
                high=f32_tensor(OBS_HIGH, [len(OBS_HIGH)]),
            ),
            action_space=tpb.Space(
                kind=tpb.SPACE_KIND_BOX,
                shape=[ACT_DIM],
                dtype=tpb.DTYPE_FLOAT32,
                low=f32_tensor([-1.0] * ACT_DIM, [ACT_DIM]),
                high=f32_tensor([1.0] * ACT_DIM, [ACT_DIM]),
            ),
            num_slots=self.num_slots,
            num_clips=NUM_CLIPS,
            capabilities=pb.Capabilities(
                batched_reset=True, streaming_step=True, cost_model=pb.CostModel(preset="off")
            ),
            server_version=SERVER_VERSION,
            api_version="fast.v1",
        )

    def _check_slots(self, slot_ids) -> None:
        if not slot_ids:
            raise invalid("slot_ids is empty; name at least one slot")
        for s in slot_ids:
            if not 0 <= s < self.num_slots:
                raise Refusal(
                    grpc.StatusCode.NOT_FOUND, f"slot {s} does not exist; this server has slots 0..{self.num_slots - 1}"
                )
        seen = set()
        for s in slot_ids:
            if s in seen:
                raise invalid(f"slot {s} appears twice in slot_ids")
            seen.add(s)

    @staticmethod
    def _check_deadline(context) -> None:
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            raise Refusal(grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed; no slot was changed")

    def _reset(self, request, context) -> pb.ResetResponse:
        started = time.perf_counter()
        slot_ids, clip_ids, seeds = list(request.slot_ids), list(request.clip_ids), list(request.seeds)
        self._check_slots(slot_ids)
        if len(clip_ids) != len(slot_ids):
            raise invalid(f"clip_ids has {len(clip_ids)} entries for {len(slot_ids)} slot_ids; give one clip per slot")
        if len(seeds) not in (0, len(slot_ids)):
            raise invalid(f"seeds has {len(seeds)} entries for {len(slot_ids)} slot_ids; give one per slot or none")
        for s, c in zip(slot_ids, clip_ids):
            if not 0 <= c < NUM_CLIPS:
                raise Refusal(
                    grpc.StatusCode.NOT_FOUND,
                    f"slot {s}: clip {c} does not exist; the catalog has clips 0..{NUM_CLIPS - 1}",
                )
        self._check_deadline(context)
        observations: list[float] = []
        for j, (s, c) in enumerate(zip(slot_ids, clip_ids)):
            self.slots[s] = Slot(c, seeds[j] if seeds else 0)
            observations += self.slots[s].observation()
        return pb.ResetResponse(
            slot_ids=slot_ids,
            observations=f32_tensor(observations, [len(slot_ids), len(OBS_LOW)]),
            timing=pb.ServerTiming(compute_s=time.perf_counter() - started),
        )

    def _step(self, request, context) -> pb.StepResponse:
        started = time.perf_counter()
        slot_ids = list(request.slot_ids)
        k = len(slot_ids)
        shape, data = decode_tensor(request.actions, "actions")  # the order of checks of fast sim-server
        self._check_slots(slot_ids)
        for s in slot_ids:
            slot = self.slots[s]
            if slot is None or slot.ended:
                why = "it was never reset" if slot is None else "its episode ended"
                raise Refusal(
                    grpc.StatusCode.FAILED_PRECONDITION, f"slot {s} has no live episode ({why}); Reset it first"
                )
        actions = actions_of(request.actions, shape, data, slot_ids)
        self._check_deadline(context)
        observations: list[float] = []
        rewards, terminated, truncated, episodes = [], [], [], []
        for j, s in enumerate(slot_ids):
            slot = self.slots[s]
            reward, term, trunc = slot.step(actions[j * ACT_DIM], actions[j * ACT_DIM + 1])
            observations += slot.observation()
            rewards.append(reward)
            terminated.append(term)
            truncated.append(trunc)
            if term or trunc:
                episodes.append(slot.summary(s, term))
        return pb.StepResponse(
            slot_ids=slot_ids,
            observations=f32_tensor(observations, [k, len(OBS_LOW)]),
            rewards=f32_tensor(rewards, [k]),
            terminated=bool_tensor(terminated),
            truncated=bool_tensor(truncated),
            episodes=episodes,
            timing=pb.ServerTiming(compute_s=time.perf_counter() - started),
            request_id=request.request_id,
        )

    def _answer(self, work, request, context):
        try:
            with self.lock:
                return work(request, context)
        except Refusal as refusal:
            context.abort(refusal.code, refusal.message)  # raises: the call ends with this status

    def Reset(self, request, context):
        return self._answer(self._reset, request, context)

    def Step(self, request, context):
        return self._answer(self._step, request, context)

    def StepStream(self, request_iterator, context):
        for request in request_iterator:  # one answer per request, in order; an error ends the stream
            yield self._answer(self._step, request, context)


# -- the run token --------------------------------------------------------------------------------


def run_token() -> str:
    """FAST's convention (docs/security.md): FAST_AUTH_TOKEN, else the file named by FAST_AUTH_TOKEN_FILE,
    else the default file $FAST_HOME/token (~/.fast/token)."""
    value, path = os.environ.get("FAST_AUTH_TOKEN"), os.environ.get("FAST_AUTH_TOKEN_FILE")
    if value is not None and path is not None:
        sys.exit("both FAST_AUTH_TOKEN and FAST_AUTH_TOKEN_FILE are set; set only one of them")
    if value is not None:
        token, source = value.strip(), "FAST_AUTH_TOKEN"
    else:
        file = Path(path) if path else Path(os.environ.get("FAST_HOME") or Path.home() / ".fast") / "token"
        try:
            token, source = file.read_text().strip(), f"token file {file}"
        except OSError as exc:
            sys.exit(f"cannot read the run token from {file} ({exc.strerror}); set FAST_AUTH_TOKEN(_FILE)")
    if not re.fullmatch(r"[\x21-\x7e]+", token):
        sys.exit(f"{source} holds an empty token or one with characters a gRPC header cannot carry")
    return token


class TokenCheck(grpc.ServerInterceptor):
    """UNAUTHENTICATED for every call without `authorization: Bearer <token>`; health stays open."""

    def __init__(self, token: str) -> None:
        self.expected = token.encode()

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_METHODS):
            return handler
        presented = b""
        for key, value in handler_call_details.invocation_metadata or ():
            if key.lower() == "authorization":
                scheme, _, token = (value.decode() if isinstance(value, bytes) else value).strip().partition(" ")
                presented = token.strip().encode() if scheme.lower() == "bearer" else b""
                break
        if hmac.compare_digest(presented, self.expected):  # constant time
            return handler
        message = ("wrong" if presented else "no") + " run token: send metadata 'authorization: Bearer <token>'"

        def refuse(request_or_iterator, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        if handler.request_streaming and handler.response_streaming:
            make = grpc.stream_stream_rpc_method_handler
        elif handler.request_streaming:
            make = grpc.stream_unary_rpc_method_handler
        elif handler.response_streaming:
            make = grpc.unary_stream_rpc_method_handler
        else:
            make = grpc.unary_unary_rpc_method_handler
        return make(
            refuse, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )


# -- the process ----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port; 0 picks a free one and prints it (default 0)")
    parser.add_argument("--slots", type=int, default=8, help="number of slots (default 8)")
    parser.add_argument("--grace", type=float, default=5.0, help="seconds to drain calls on SIGTERM (default 5)")
    args = parser.parse_args()
    if not 1 <= args.slots <= 65536:
        parser.error("--slots must be in 1..65536")

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        interceptors=[TokenCheck(run_token())],
        options=[("grpc.so_reuseport", 0)],  # a port of its own: no second server may share it
    )
    pb_grpc.add_SimulatorServicer_to_server(PointMassSimulator(args.slots), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    host = f"[{args.host}]" if ":" in args.host else args.host
    port = server.add_insecure_port(f"{host}:{args.port}")
    if port == 0:
        sys.exit(f"cannot bind {host}:{args.port}")
    server.start()
    for name in ("", SERVICE):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

    def drain(signum, frame) -> None:
        # Probes see NOT_SERVING at once; calls in flight get `grace` seconds to finish, new ones are refused.
        health_servicer.enter_graceful_shutdown()
        server.stop(args.grace)

    signal.signal(signal.SIGTERM, drain)
    signal.signal(signal.SIGINT, drain)
    print(f"python_sim listening on {host}:{port} env={ENV_ID} slots={args.slots}", flush=True)
    server.wait_for_termination()
    return 0


if __name__ == "__main__":
    sys.exit(main())

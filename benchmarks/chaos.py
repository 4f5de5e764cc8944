"""Chaos: one `fast`-mode training run on the local stack while its processes are killed, frozen and lied to.

    python benchmarks/chaos.py                       # the committed run -> benchmarks/results/chaos/
    python benchmarks/chaos.py --iterations 8 --kills 2 --stops 1 --garbage-s 2 --no-baseline --out /tmp/chaos

The stack is what `fast train` starts, as real processes on loopback with a run token of the
benchmark's own (jobs/tokens.py): S simulator servers (takeover), the learner, the broker. Between
them sit small grpc.aio proxies of this file, one in front of each simulator server and one in
front of the learner, that forward every call as it is (the token included) and record what went
through. The broker knows only the proxies' addresses.

During the run, on a seeded schedule (each fault fires once the learner has accepted a drawn number
of batches, plus a drawn delay, so that every fault lands inside the run whatever its speed):

- `sim-kill`: a simulator server is SIGKILLed, its proxy closed with it (the broker's connections
  drop and the port refuses, as after a real crash), and both restarted on their old ports;
- `sim-stop`: a simulator server is SIGSTOPped for longer than the broker's step deadline (and
  its reset deadline: whatever call is in flight times out), then SIGCONTed (its connections stay
  open; calls just go unanswered);
- `garbage`: for a window, the proxy of one simulator corrupts some of its real Step answers
  (an observation of the wrong shape, a NaN reward, a slot both terminated and truncated), never
  more than `max_bad_answers - 1` in a row so that the broker faults the simulator but keeps it
  (dropping after too many in a row is tests/test_broker_answers.py's);
- `learner-kill`: the learner is SIGKILLed while it serves a SubmitBatch (its proxy closed with
  it) and restarted on its port; it resumes from its newest checkpoint, the broker waits for it
  (bounded by learner_wait_s) and must send the same batch again.

Simulator faults may overlap; the learner's kill overlaps none (see Injector). The baseline runs
through the same proxies. The PPO update is kept light (2 epochs of 4 minibatches): this measures
the wire and the fault handling, not learning.

What is checked, from the proxies' records alone:

- corruption: every simulator answer delivered intact adds, per slot, the key
  hash(observation the slot held before the step, reward, terminated); a corrupted answer adds
  its real keys to a `spoiled` set instead. Every valid transition of every batch the broker
  submits must have its (observation, reward, terminated) among the produced keys, none among the
  spoiled ones, and no value that is not finite, nor terminated together with truncated;
- batches: each SubmitBatch (by content digest) accepted, refused as stale, or failed in transport
  and sent again; the learner's final version against the batches it acknowledged;
- versions: the versions of the accepted batches, the `policy_version` of metrics.jsonl and the
  learner's checkpoint files (one per version, checkpoint_every 1) must each be 0, 1, ..., n-1;
- hangs: the longest gap without a valid simulator step or an accepted batch, against the stall
  timeout (against learner_wait_s while the learner is down: the broker then waits by design);
- recovery: from each fault to that simulator's first good Step answer (the learner's first
  answer), per fault kind;
- throughput: valid transitions learnt per second against the same run, same seed and settings,
  without faults (through the same proxies), run first in this script.

checkpoint_every is 1: with K > 1 a killed learner resumes up to K-1 versions back and those
versions are trained again, by design (docs/learner.md); this benchmark wants to see whether
anything is lost or repeated beyond that design.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc  # noqa: E402
import numpy as np  # noqa: E402

from fast import tensor  # noqa: E402
from fast.tensor import TensorError  # noqa: E402
from fast.v1 import learner_pb2  # noqa: E402
from fast.v1 import simulator_pb2 as sim_pb  # noqa: E402
from fast.v1 import simulator_pb2_grpc as sim_grpc  # noqa: E402
from jobs import processes  # noqa: E402
from jobs.tokens import JobToken, temporary_job_token  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "chaos"
MAX_MESSAGE_BYTES = 256 << 20
CORRUPTIONS = ("observation shape", "NaN reward", "terminated and truncated")
# The field the broker must name for each corruption (broker/answers.py).
CORRUPTION_FIELD = {
    "observation shape": "observations",
    "NaN reward": "rewards",
    "terminated and truncated": "terminated/truncated",
}
_CKPT = re.compile(r"^ckpt-(\d+)\.pt$")
_BAD_ANSWER = re.compile(r"simulator (\S+) is down: bad answer \(\d+ in a row\): ([\w/]+)")
_DOWN = re.compile(r"simulator (\S+) is down: ")
_READMITTED = re.compile(r"simulator (\S+) re-admitted")


@dataclass(frozen=True)
class ChaosConfig:
    iterations: int = 80
    samples: int = 512  # valid transitions per iteration (at least)
    servers: int = 3
    slots: int = 4  # per server
    preset: str = "step-only"  # simulator cost model: step latency only, resets free
    seed: int = 0
    update_epochs: int = 2
    num_minibatches: int = 4
    checkpoint_every: int = 1
    # Faults of the chaos run.
    kills: int = 12
    stops: int = 4
    # A stop lasts this many times the longest deadline of a call to the simulator (Step, Reset), drawn:
    # whatever call is in flight when it freezes times out.
    stop_factor: tuple[float, float] = (1.2, 2.0)
    garbage_s: float = 6.0  # the garbage window; 0: none
    garbage_rate: float = 0.5  # share of the window's Step answers corrupted
    learner_kills: int = 1
    # The learner is killed while it serves a SubmitBatch (a drawn 0-50 ms after the batch reached its
    # proxy): the update in flight is lost and the broker must send the same batch again. False: at
    # its drawn time, wherever the run is.
    learner_kill_in_update: bool = True
    recovery_wait_s: float = 30.0  # a target's next fault waits this long at most for it to recover
    # The broker's deadlines (broker/config.py), short so that waits do not dominate the run.
    step_timeout_s: float = 1.0
    reset_timeout_s: float = 2.0
    describe_timeout_s: float = 1.0
    stall_timeout_s: float = 15.0
    learner_wait_s: float = 60.0
    update_timeout_s: float = 60.0
    max_bad_answers: int = 5
    run_timeout_s: float = 300.0  # a run whose broker has not exited by then is stopped (and reported)
    baseline: bool = True  # the same run without faults first, for the throughput ratio

    def __post_init__(self) -> None:
        low = {k: getattr(self, k) for k in ("iterations", "samples", "servers", "slots") if getattr(self, k) < 1}
        if low:
            raise ValueError(f"{low}: each must be >= 1")
        if self.iterations < 3 and (self.kills or self.stops or self.learner_kills or self.garbage_s):
            raise ValueError("faults need at least 3 iterations to land inside the run")


@dataclass(frozen=True)
class Fault:
    kind: str  # sim-kill, sim-stop, garbage, learner-kill
    target: int  # simulator index; -1 the learner
    at_iteration: int  # fires once the learner accepted this many batches ...
    delay_s: float  # ... and this long after
    duration_s: float = 0.0  # sim-stop: frozen this long; garbage: the window


def make_plan(cfg: ChaosConfig) -> list[Fault]:
    """The seeded fault schedule: trigger iterations spread over the run, targets drawn."""
    rng = np.random.default_rng(cfg.seed + 7919)
    last = max(1, cfg.iterations - 3)  # room for the last faults to recover inside the run
    plan: list[Fault] = []

    def at(low: float = 0.0, high: float = 1.0) -> int:
        return int(rng.integers(max(1, int(low * last)), max(2, int(high * last) + 1)))

    for _ in range(cfg.kills):
        plan.append(Fault("sim-kill", int(rng.integers(cfg.servers)), at(), float(rng.uniform(0, 1.0))))
    for _ in range(cfg.stops):
        lo, hi = cfg.stop_factor
        duration = float(rng.uniform(lo, hi)) * max(cfg.step_timeout_s, cfg.reset_timeout_s)
        plan.append(Fault("sim-stop", int(rng.integers(cfg.servers)), at(), float(rng.uniform(0, 1.0)), duration))
    if cfg.garbage_s > 0:
        plan.append(Fault("garbage", int(rng.integers(cfg.servers)), at(0.2, 0.6), 0.0, cfg.garbage_s))
    for _ in range(cfg.learner_kills):
        # duration_s: the wait after a SubmitBatch reached the learner's proxy (learner_kill_in_update).
        plan.append(Fault("learner-kill", -1, at(0.3, 0.7), float(rng.uniform(0, 1.0)), float(rng.uniform(0, 0.05))))
    return sorted(plan, key=lambda f: (f.at_iteration, f.delay_s))


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


# -- the stack ------------------------------------------------------------------------------------


def _flags(values: dict) -> list[str]:
    return [part for name, value in values.items() for part in (f"--{name}", str(value))]


class Stack:
    """The processes and proxies of one run; every process it ever launched is stopped by `shutdown`."""

    def __init__(self, cfg: ChaosConfig, token: JobToken, work: Path, ledger: Ledger, log) -> None:
        self.cfg, self.token, self.work, self.ledger, self.log = cfg, token, work, ledger, log
        self.launched: list[processes.Launch] = []
        self.sims: list[processes.Launch] = []
        self.sim_ports: list[int] = []
        self.sim_proxies: list[SimulatorProxy] = []
        self.learner: processes.Launch | None = None
        self.learner_port = 0
        self.learner_proxy: LearnerProxy | None = None
        self.broker: processes.Launch | None = None
        self.frozen: set[int] = set()  # pids SIGSTOPped and not yet SIGCONTed
        self.left_running: list[str] = []  # after shutdown: should stay empty
        self.t0 = time.monotonic()

    def _launch(self, name: str, args: list[str], env: dict[str, str]) -> processes.Launch:
        child = processes.launch(name, args, {**self.token.env, **env}, new_session=True)
        self.launched.append(child)
        return child

    async def _listening(self, child: processes.Launch, timeout_s: float = 90.0) -> str:
        service = await asyncio.to_thread(processes.wait_listening, child, time.monotonic() + timeout_s)
        return service.address

    def _sim(self, i: int, port: int) -> processes.Launch:
        c = self.cfg
        flags = {"env": "takeover", "slots": c.slots, "host": "127.0.0.1", "port": port, "cost-preset": c.preset}
        return self._launch(f"sim-{i}", ["sim-server", *_flags(flags)], {})

    def _learner(self, port: int) -> processes.Launch:
        c = self.cfg
        flags = {
            "host": "127.0.0.1",
            "port": port,
            "checkpoint-dir": self.work / "checkpoints",
            "seed": c.seed,
            "update-epochs": c.update_epochs,
            "num-minibatches": c.num_minibatches,
            "checkpoint-every": c.checkpoint_every,
            "keep-checkpoints": c.iterations + 10,  # every version stays on disk: the sequence is checked
        }
        return self._launch("learner", ["learner", *_flags(flags)], {})

    async def start(self) -> None:
        c = self.cfg
        self.sims = [self._sim(i, 0) for i in range(c.servers)]
        self.learner = self._learner(0)
        addresses = await asyncio.gather(*(self._listening(x) for x in [*self.sims, self.learner]))
        self.sim_ports = [int(a.rsplit(":", 1)[1]) for a in addresses[:-1]]
        self.learner_port = int(addresses[-1].rsplit(":", 1)[1])
        for i, address in enumerate(addresses[:-1]):
            proxy = SimulatorProxy(i, address, self.ledger, c.seed * 1000 + i, max(0, c.max_bad_answers - 1))
            await proxy.start()
            self.sim_proxies.append(proxy)
        self.learner_proxy = LearnerProxy(addresses[-1], self.ledger)
        await self.learner_proxy.start()
        # The broker's deadlines, the way a deployment sets them (broker/config.py).
        env = {
            f"FAST_BROKER_{name.upper()}": repr(getattr(c, name))
            for name in (
                "step_timeout_s",
                "reset_timeout_s",
                "describe_timeout_s",
                "stall_timeout_s",
                "learner_wait_s",
                "update_timeout_s",
                "max_bad_answers",
            )
        }
        flags = {
            "simulators": ",".join(p.address for p in self.sim_proxies),
            "learner": self.learner_proxy.address,
            "mode": "fast",
            "samples-per-iteration": c.samples,
            "iterations": c.iterations,
            "seed": c.seed,
            "run-dir": self.work,
            "host": "127.0.0.1",
            "port": 0,
        }
        args = ["broker", *_flags(flags)]
        self.broker = self._launch("broker", args, env)
        await self._listening(self.broker)
        self.t0 = time.monotonic()

    # -- faults ---------------------------------------------------------------------------------
    async def kill_sim(self, i: int) -> dict:
        t = time.monotonic()
        self.sims[i].process.kill()
        await self.sim_proxies[i].close()
        await asyncio.to_thread(self.sims[i].process.wait, 10)
        self.sims[i] = self._sim(i, self.sim_ports[i])
        await self._listening(self.sims[i])
        back = time.monotonic()
        await self.sim_proxies[i].start()
        return {"t_fault": t, "t_resumed": time.monotonic(), "restart_s": back - t}

    async def stop_sim(self, i: int, duration_s: float) -> dict:
        pid = self.sims[i].process.pid
        t = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        self.frozen.add(pid)
        try:
            await asyncio.sleep(duration_s)
        finally:
            os.kill(pid, signal.SIGCONT)
            self.frozen.discard(pid)
        return {"t_fault": t, "t_resumed": time.monotonic(), "stopped_s": duration_s}

    async def kill_learner(self) -> dict:
        in_flight = any(b["outcome"] == "pending" for b in self.ledger.batches)
        t = time.monotonic()
        self.learner.process.kill()
        await self.learner_proxy.close()
        await asyncio.to_thread(self.learner.process.wait, 10)
        self.learner = self._learner(self.learner_port)
        await self._listening(self.learner)
        back = time.monotonic()
        await self.learner_proxy.start()
        return {"t_fault": t, "t_resumed": time.monotonic(), "restart_s": back - t, "batch_in_flight": in_flight}

    # -- the end --------------------------------------------------------------------------------
    async def shutdown(self) -> dict[str, int | None]:
        """Every process launched, broker first, then the learner (final checkpoint), then simulators."""
        for pid in list(self.frozen):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.frozen.clear()
        codes: dict[str, int | None] = {}
        order = sorted(self.launched, key=lambda x: {"broker": 0, "learner": 1}.get(x.name, 2))
        for child in order:
            # In a thread: the broker finishing its iteration still needs the proxies to answer.
            code = await asyncio.to_thread(processes.stop, child, 15.0)
            if child is self.broker or child is self.learner or any(child is s for s in self.sims):
                codes[child.name] = code
        for proxy in [*self.sim_proxies, self.learner_proxy]:
            if proxy is not None:
                await proxy.close()
        self.left_running = [f"{c.name} (pid {c.process.pid})" for c in self.launched if c.process.poll() is None]
        return codes


class Injector:
    """Runs the plan: one task per target, its faults in order, each after the target recovered.

    Simulators' faults may overlap one another; the learner's kill does not overlap any of them
    (it waits for them to end and holds theirs until the learner answers again), so that each
    recovery time measures one fault and not a simulator waiting on the learner.
    """

    def __init__(self, stack: Stack, plan: list[Fault], cfg: ChaosConfig, log) -> None:
        self.stack, self.plan, self.cfg, self.log = stack, plan, cfg, log
        self.done = asyncio.Event()  # the broker exited
        self.sim_faults_open = 0  # simulator faults injected and not yet recovered
        self.learner_down = False

    async def run(self) -> None:
        targets = sorted({f.target for f in self.plan})
        await asyncio.gather(*(self._target([f for f in self.plan if f.target == t]) for t in targets))

    async def _until(self, condition, timeout_s: float | None = None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not condition():
            if self.done.is_set() or (deadline is not None and time.monotonic() > deadline):
                return condition()
            await asyncio.sleep(0.05)
        return True

    def _recovered(self, target: int, since: float) -> bool:
        ledger = self.stack.ledger
        times = ledger.learner_ok if target < 0 else ledger.good_steps[target]
        return bool(times) and times[-1] > since

    async def _target(self, faults: list[Fault]) -> None:
        ledger = self.stack.ledger
        since = 0.0
        for fault in faults:
            await self._until(lambda f=fault: ledger.accepted >= f.at_iteration)
            await self._until(lambda: False, fault.delay_s)
            await self._until(lambda: self._recovered(fault.target, since), self.cfg.recovery_wait_s)
            if fault.target < 0:
                self.learner_down = True  # no new simulator fault from here ...
                await self._until(lambda: self.sim_faults_open == 0, 2 * self.cfg.recovery_wait_s)
            else:
                await self._until(lambda: not self.learner_down)
            if self.done.is_set():
                ledger.faults.append({**asdict(fault), "injected": False})
                self.learner_down = False
                continue
            event = {**asdict(fault), "injected": True, "iteration": ledger.accepted}
            if fault.target >= 0:
                self.sim_faults_open += 1
            try:
                if fault.kind == "sim-kill":
                    event.update(await self.stack.kill_sim(fault.target))
                elif fault.kind == "sim-stop":
                    event.update(await self.stack.stop_sim(fault.target, fault.duration_s))
                elif fault.kind == "garbage":
                    proxy = self.stack.sim_proxies[fault.target]
                    proxy.start_garbage(fault.duration_s, self.cfg.garbage_rate)
                    t = time.monotonic()
                    await self._until(lambda: False, fault.duration_s)
                    event.update(t_fault=t, t_resumed=time.monotonic())
                else:
                    if self.cfg.learner_kill_in_update:
                        pending = lambda: any(b["outcome"] == "pending" for b in ledger.batches)  # noqa: E731
                        await self._until(pending, 60)
                        await asyncio.sleep(fault.duration_s)
                    event.update(await self.stack.kill_learner())
                since = event["t_resumed"]
                ledger.faults.append(event)
                self.log(
                    f"  {event['t_fault'] - self.stack.t0:7.1f} s  {fault.kind:12s} "
                    f"{'learner' if fault.target < 0 else f'sim-{fault.target}'} at iteration {event['iteration']}, "
                    f"back after {event['t_resumed'] - event['t_fault']:.1f} s"
                )
                await self._until(lambda: self._recovered(fault.target, since), self.cfg.recovery_wait_s)
            finally:
                if fault.target >= 0:
                    self.sim_faults_open -= 1
                else:
                    self.learner_down = False  # ... until the learner answered again


async def run_once(cfg: ChaosConfig, plan: list[Fault], label: str, work: Path, token: JobToken, log) -> dict:
    """One training run under `plan` (empty: no faults); returns its analysis."""
    ledger = Ledger()
    stack = Stack(cfg, token, work, ledger, log)
    injector = Injector(stack, plan, cfg, log)
    broker_code, timed_out, codes = None, False, {}
    started = time.monotonic()
    task = None
    try:
        await stack.start()
        log(f"{label}: stack up in {time.monotonic() - started:.1f} s; broker training {cfg.iterations} iterations")
        task = asyncio.create_task(injector.run())
        deadline = time.monotonic() + cfg.run_timeout_s
        while stack.broker.process.poll() is None and time.monotonic() < deadline:
            if task.done() and task.exception() is not None:
                raise task.exception()
            await asyncio.sleep(0.1)
        broker_code = stack.broker.process.poll()
        timed_out = broker_code is None
        t_end = time.monotonic()
    finally:
        injector.done.set()
        if task is not None:
            try:
                await asyncio.wait_for(task, 60)
            except Exception as exc:  # a fault that failed to inject; reported, the processes still stop
                log(f"{label}: fault injection failed: {type(exc).__name__}: {exc}")
        codes = await stack.shutdown()
    broker_lines = list(stack.broker.lines) if stack.broker else []
    learner_lines = [line for child in stack.launched if child.name == "learner" for line in child.lines]
    return analyse(cfg, label, ledger, stack, broker_code, timed_out, t_end, codes, broker_lines, learner_lines)


# -- analysis -------------------------------------------------------------------------------------


def _summary(values: list[float]) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"count": 0, "median_s": None, "max_s": None}
    return {"count": len(values), "median_s": statistics.median(values), "max_s": max(values)}


def _first_after(times: list[float], t: float) -> float | None:
    return next((x for x in times if x > t), None)


def _sequence_problems(versions: list[int]) -> dict:
    seen, duplicated = set(), []
    for v in versions:
        if v in seen:
            duplicated.append(v)
        seen.add(v)
    skipped = sorted(set(range(max(versions) + 1)) - seen) if versions else []
    in_order = versions == sorted(versions)
    return {"duplicated": sorted(set(duplicated)), "skipped": skipped, "in_order": in_order}


def analyse(cfg, label, ledger, stack, broker_code, timed_out, t_end, codes, broker_lines, learner_lines) -> dict:
    t0 = stack.t0
    metrics_path = stack.work / "metrics.jsonl"
    metrics = (
        [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()] if metrics_path.exists() else []
    )
    batches = ledger.batches
    accepted = [b for b in batches if b.get("outcome") == "accepted"]
    by_digest: dict[str, list[dict]] = {}
    for b in batches:
        by_digest.setdefault(b.get("digest", "?"), []).append(b)
    fates = {}
    for digest, tries in by_digest.items():
        outcomes = [t["outcome"] for t in tries]
        fates[digest] = (
            "accepted" if "accepted" in outcomes else ("refused-stale" if "refused-stale" in outcomes else "lost")
        )
    accepted_twice = sum(1 for tries in by_digest.values() if sum(t["outcome"] == "accepted" for t in tries) > 1)
    checkpoints = sorted(
        int(m.group(1)) for p in (stack.work / "checkpoints").glob("ckpt-*.pt") if (m := _CKPT.match(p.name))
    )
    final_version = checkpoints[-1] if checkpoints else None
    accepted_versions = [b["version"] for b in accepted]
    metric_versions = [int(m["policy_version"]) for m in metrics]
    replies_ok = all(b["reply_version"] == b["version"] + 1 for b in accepted)

    # Recovery: each fault to that target's first good answer after it was back. A fault with no
    # such answer is unrecovered, unless the run ended less than a stall timeout after it was back.
    recoveries: dict[str, list[float | None]] = {}
    after_resume: dict[str, list[float | None]] = {}
    unrecovered: dict[str, int] = {}
    ended_first: dict[str, int] = {}

    def account(kind: str, t_fault: float, t_resumed: float, times: list[float], event: dict) -> None:
        back = _first_after(times, t_resumed)
        event["recovered_s"] = None if back is None else back - t_fault
        event["after_resume_s"] = None if back is None else back - t_resumed
        if back is None:
            late = t_end - t_resumed < cfg.stall_timeout_s
            (ended_first if late else unrecovered)[kind] = (ended_first if late else unrecovered).get(kind, 0) + 1
            return
        recoveries.setdefault(kind, []).append(event["recovered_s"])
        after_resume.setdefault(kind, []).append(event["after_resume_s"])

    for f in ledger.faults:
        if f["injected"] and f["kind"] != "garbage":
            times = ledger.learner_ok if f["target"] < 0 else ledger.good_steps[f["target"]]
            account(f["kind"], f["t_fault"], f["t_resumed"], times, f)
    for c in ledger.corrupted:
        account("garbage", c["t"], c["t"], ledger.good_steps[c["sim"]], c)

    # Hangs: gaps without a valid step or an accepted batch, from the first reset to the broker's exit.
    progress = sorted([t for ts in ledger.good_steps.values() for t in ts] + [b["t_reply"] for b in accepted])
    start = ledger.first_reset or t0
    marks = [start, *[t for t in progress if t >= start], t_end]
    learner_down = [
        (f["t_fault"], _first_after(ledger.learner_ok, f["t_resumed"]) or t_end)
        for f in ledger.faults
        if f["injected"] and f["kind"] == "learner-kill"
    ]
    gaps = []
    for a, b in zip(marks, marks[1:]):
        during_learner_outage = any(lo <= b and a <= hi for lo, hi in learner_down)
        bound = cfg.learner_wait_s if during_learner_outage else cfg.stall_timeout_s
        gaps.append((b - a, a - t0, bound, during_learner_outage))
    longest = max(gaps, default=(0.0, 0.0, cfg.stall_timeout_s, False))
    hangs = [{"gap_s": g, "at_s": at, "bound_s": bound} for g, at, bound, _ in gaps if g > bound]

    # Throughput: valid transitions learnt per second, from the first reset to the last accepted batch.
    valid = sum(b["valid"] for b in accepted)
    window = (accepted[-1]["t_reply"] - start) if accepted else None
    sampling_s = sum(m["valid_transitions"] / m["effective_throughput"] for m in metrics if m["effective_throughput"])

    # What the broker said about the simulators (its log): faults, readmissions, bad answers by field.
    proxy_index = {p.address: p.index for p in stack.sim_proxies}
    bad_fields: dict[str, int] = {}
    bad_by_sim: dict[int, int] = {}
    down = readmitted = 0
    for line in broker_lines:
        if m := _BAD_ANSWER.search(line):
            bad_fields[m.group(2)] = bad_fields.get(m.group(2), 0) + 1
            bad_by_sim[proxy_index.get(m.group(1), -1)] = bad_by_sim.get(proxy_index.get(m.group(1), -1), 0) + 1
        if _DOWN.search(line):
            down += 1
        if _READMITTED.search(line):
            readmitted += 1
    corrupted_kinds: dict[str, int] = {}
    for c in ledger.corrupted:
        corrupted_kinds[c["kind"]] = corrupted_kinds.get(c["kind"], 0) + 1
    expected_fields: dict[str, int] = {}
    for kind, n in corrupted_kinds.items():
        expected_fields[CORRUPTION_FIELD[kind]] = expected_fields.get(CORRUPTION_FIELD[kind], 0) + n

    injected: dict[str, int] = {}
    for f in ledger.faults:
        if f["injected"]:
            injected[f["kind"]] = injected.get(f["kind"], 0) + 1
    corruption = {
        "valid_transitions_checked": sum(b["valid"] for b in batches),
        "not_produced_by_a_simulator": sum(b["unknown"] for b in batches),
        "from_a_corrupted_answer": sum(b["spoiled"] for b in batches),
        "non_finite_values": sum(b["nonfinite"] for b in batches),
        "terminated_and_truncated": sum(b["both_flags"] for b in batches),
        "undecodable_batches": sum(1 for b in batches if "undecodable" in b),
    }
    versions = {
        "accepted_batches": _sequence_problems(accepted_versions),
        "metrics_jsonl": _sequence_problems(metric_versions),
        "checkpoints": _sequence_problems(checkpoints),
        "replies_are_version_plus_one": replies_ok,
        "learner_final_version": final_version,
    }
    result = {
        "label": label,
        "iterations_asked": cfg.iterations,
        "iterations_done": len(metrics),
        "broker_exit_code": broker_code,
        "broker_timed_out": timed_out,
        "completed": broker_code == 0 and len(metrics) == cfg.iterations,
        "exit_codes": codes,
        "wall_s": t_end - t0,
        "training_window_s": window,
        "valid_transitions_learnt": valid,
        "valid_per_s": valid / window if window else None,
        "sampling_valid_per_s": sum(m["valid_transitions"] for m in metrics) / sampling_s if sampling_s else None,
        "faults_injected": injected,
        "faults_not_injected": [f for f in ledger.faults if not f["injected"]],
        "fault_events": [_relative(f, t0) for f in ledger.faults if f["injected"]],
        "recovery": {k: _summary(v) for k, v in sorted(recoveries.items())},
        "recovery_after_resume": {k: _summary(v) for k, v in sorted(after_resume.items())},
        "unrecovered": unrecovered,
        "run_ended_before_recovery": ended_first,
        "batches": {
            "submit_calls": len(batches),
            "distinct": len(by_digest),
            "accepted": len(accepted),
            "accepted_twice": accepted_twice,
            "refused_stale_calls": sum(1 for b in batches if b["outcome"] == "refused-stale"),
            "transport_failed_calls": sum(
                1 for b in batches if b["outcome"] not in ("accepted", "refused-stale", "pending")
            ),
            "unanswered_calls": sum(1 for b in batches if b["outcome"] == "pending"),
            "distinct_refused_stale": sum(1 for v in fates.values() if v == "refused-stale"),
            "distinct_lost": sum(1 for v in fates.values() if v == "lost"),
            # Sent more than once (a call failed, e.g. the learner was killed serving it) and then accepted.
            "sent_again_accepted": sum(
                1 for d, tries in by_digest.items() if len(tries) > 1 and fates[d] == "accepted"
            ),
            "learner_versions_vs_accepted": (final_version - len(accepted)) if final_version is not None else None,
        },
        "corruption": corruption,
        "versions": versions,
        "progress": {
            "longest_gap_s": longest[0],
            "longest_gap_at_s": longest[1],
            "longest_gap_bound_s": longest[2],
            "longest_gap_during_learner_outage": longest[3],
            "hangs": hangs,
        },
        "garbage": {
            "corrupted_answers": len(ledger.corrupted),
            "by_kind": corrupted_kinds,
            "broker_bad_answers_by_field": bad_fields,
            "expected_by_field": expected_fields,
            "broker_bad_answers_by_sim": {str(k): v for k, v in bad_by_sim.items()},
        },
        "broker_log": {"simulator_down": down, "readmitted": readmitted},
        # Readmission attempts (Describe) that failed while the simulator was up but frozen: each
        # held the broker's round start (broker/samplers/lockstep.py awaits readmit_due) this long.
        "failed_describes": {
            "count": sum(1 for d in ledger.describes if not d["ok"]),
            "total_s": sum(d["s"] for d in ledger.describes if not d["ok"]),
        },
        "metrics_faults": sum(int(m.get("faults", 0)) for m in metrics),
        "episode_ends_fault": sum(int(m.get("episode_ends", {}).get("fault", 0)) for m in metrics),
        "broker_tail": broker_lines[-8:] if broker_code != 0 else [],
        "learner_restarts": sum(1 for line in learner_lines if "listening on" in line) - 1,
        "processes_launched": len(stack.launched),
        "processes_left_running": stack.left_running,
    }
    result["verdict"] = verdict(cfg, result, bool(ledger.faults))
    return result


def _relative(event: dict, t0: float) -> dict:
    out = {}
    for k, v in event.items():
        out[k] = round(v - t0, 3) if k.startswith("t_") and isinstance(v, float) else v
    return out


def verdict(cfg: ChaosConfig, r: dict, chaos: bool) -> dict[str, bool]:
    """The targets, each true when met."""
    b, c, v = r["batches"], r["corruption"], r["versions"]
    checks = {
        "run completed": r["completed"],
        "no corrupted transition": all(
            c[k] == 0
            for k in (
                "not_produced_by_a_simulator",
                "from_a_corrupted_answer",
                "non_finite_values",
                "terminated_and_truncated",
                "undecodable_batches",
            )
        ),
        "no lost batch": b["distinct_lost"] == 0
        and b["unanswered_calls"] == 0
        and b["accepted"] == r["iterations_done"]
        and b["learner_versions_vs_accepted"] == 0,
        "no duplicated or skipped version": all(
            not s["duplicated"] and not s["skipped"] and s["in_order"]
            for s in (v["accepted_batches"], v["metrics_jsonl"], v["checkpoints"])
        )
        and v["replies_are_version_plus_one"]
        and b["accepted_twice"] == 0,
        "no hang": not r["progress"]["hangs"],
        "every process stopped at the end": not r["processes_left_running"],
    }
    if chaos:
        g = r["garbage"]
        checks["every fault recovered"] = not any(r["unrecovered"].values())
        checks["every garbage answer faulted by field"] = (
            g["broker_bad_answers_by_field"] == g["expected_by_field"] and g["corrupted_answers"] > 0
        ) or (cfg.garbage_s == 0)
        checks["all planned faults injected"] = not r["faults_not_injected"]
    return checks


# -- the report -----------------------------------------------------------------------------------


def context() -> dict:
    model = ""
    try:
        model = next(
            (x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in x),
            "",
        )
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "cpu": model or platform.processor(),
        "python": platform.python_version(),
        "grpc": grpc.__version__,
        "load_average": os.getloadavg(),
    }


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _fault_counts(run: dict) -> str:
    """What was done to whom, how often: 'sim-0: 4 sim-kill, 1 sim-stop; ...'."""
    counts: dict[str, dict[str, int]] = {}
    for event in run["fault_events"]:
        target = "learner" if event["target"] < 0 else f"sim-{event['target']}"
        counts.setdefault(target, {})
        counts[target][event["kind"]] = counts[target].get(event["kind"], 0) + 1
    return "; ".join(
        f"{target}: " + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
        for target, kinds in sorted(counts.items())
    )


# The figures table: a row's label, and the dotted path(s) of its value(s) in a run's result.
FIGURES = (
    ("iterations done / asked", "iterations_done / iterations_asked"),
    ("broker exit code", "broker_exit_code"),
    ("valid transitions learnt", "valid_transitions_learnt"),
    ("training window (s)", "training_window_s"),
    ("**valid transitions / s**", "valid_per_s"),
    ("sampling-only valid transitions / s", "sampling_valid_per_s"),
    ("SubmitBatch calls / distinct batches", "batches.submit_calls / batches.distinct"),
    (
        "accepted / refused stale / failed in transport",
        "batches.accepted / batches.refused_stale_calls / batches.transport_failed_calls",
    ),
    ("batches lost / accepted twice", "batches.distinct_lost / batches.accepted_twice"),
    ("batches sent again after a failed call, then accepted", "batches.sent_again_accepted"),
    ("learner's final version", "versions.learner_final_version"),
    ("valid transitions checked", "corruption.valid_transitions_checked"),
    ("... not produced by a simulator", "corruption.not_produced_by_a_simulator"),
    ("... taken from a corrupted answer", "corruption.from_a_corrupted_answer"),
    ("... non-finite / terminated and truncated", "corruption.non_finite_values / corruption.terminated_and_truncated"),
    (
        "duplicated / skipped versions: accepted batches",
        "versions.accepted_batches.duplicated / versions.accepted_batches.skipped",
    ),
    ("... metrics.jsonl", "versions.metrics_jsonl.duplicated / versions.metrics_jsonl.skipped"),
    ("... learner checkpoints", "versions.checkpoints.duplicated / versions.checkpoints.skipped"),
    ("longest gap without progress (s)", "progress.longest_gap_s"),
    ("hangs (a gap over its bound)", "progress.hangs"),
    ("slot-steps lost to faults (metrics.jsonl)", "metrics_faults"),
    ("broker log: simulator down / re-admitted", "broker_log.simulator_down / broker_log.readmitted"),
    ("failed readmission attempts / seconds they took", "failed_describes.count / failed_describes.total_s"),
)


def markdown(result: dict) -> str:
    cfg, runs = result["config"], result["runs"]
    chaos = runs["chaos"]
    base = runs.get("baseline")
    lines = [
        "# Chaos: one `fast`-mode run while its processes are killed, frozen and lied to",
        "",
        f"    {result['command']}",
        "",
        f"{result['context']['cores']} cores ({result['context']['cpu']}), load average "
        f"{', '.join(f'{x:.1f}' for x in result['context']['load_average_start'])} at the start "
        f"(shared with other jobs); {cfg['servers']} simulator servers x {cfg['slots']} slots (takeover, "
        f"cost preset `{cfg['preset']}`), {cfg['iterations']} iterations of >= {cfg['samples']} valid samples, "
        f"seed {cfg['seed']}; broker step deadline {cfg['step_timeout_s']:g} s, stall timeout "
        f"{cfg['stall_timeout_s']:g} s, learner wait {cfg['learner_wait_s']:g} s; learner checkpoint every "
        f"{cfg['checkpoint_every']} version(s). Wall clock of the whole benchmark: {result['wall_clock_s']:.0f} s.",
        "",
        f"Faults injected in the chaos run: {_fault_counts(chaos)}.",
        "",
        "## Verdict",
        "",
        "| target | met |",
        "|---|---|",
        *[f"| {name} | {'yes' if ok else '**NO**'} |" for name, ok in chaos["verdict"].items()],
        "",
        "## Figures",
        "",
        "| | " + ("baseline (no faults) | " if base else "") + "chaos |",
        "|---|" + ("---:|" if base else "") + "---:|",
    ]

    def cell(r: dict, paths: str) -> str:
        """Values at dotted `paths` (several joined by ' / '); a list counts its items."""
        values = []
        for path in paths.split(" / "):
            value = r
            for key in path.split("."):
                value = value[key]
            values.append(_fmt(len(value) if isinstance(value, list) else value))
        return " / ".join(values)

    for name, paths in FIGURES:
        lines.append(f"| {name} | " + " | ".join(cell(r, paths) for r in ([base] if base else []) + [chaos]) + " |")
    if base and base["valid_per_s"] and chaos["valid_per_s"]:
        lines += ["", f"**Throughput with faults / without: {chaos['valid_per_s'] / base['valid_per_s']:.2f}**"]
    lines += [
        "",
        "## Faults and recovery (chaos run)",
        "",
        "Recovery: from the fault (SIGKILL, SIGSTOP, the corrupted answer, the learner's SIGKILL) to that "
        "simulator's first intact Step answer (the learner's first answer). *After resume*: from the process "
        "being back (listening again, SIGCONT) to that answer, the broker's share.",
        "",
        "| fault | injected | recovered | recovery: median (s) | max (s) | after resume: median (s) | max (s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind in ("sim-kill", "sim-stop", "garbage", "learner-kill"):
        rec, aft = chaos["recovery"].get(kind), chaos["recovery_after_resume"].get(kind)
        n = chaos["garbage"]["corrupted_answers"] if kind == "garbage" else chaos["faults_injected"].get(kind, 0)
        label = f"{kind} (corrupted answers)" if kind == "garbage" else kind
        if rec is None:
            lines.append(f"| {label} | {n} | 0 | - | - | - | - |")
            continue
        lines.append(
            f"| {label} | {n} | {rec['count']} | {_fmt(rec['median_s'])} | {_fmt(rec['max_s'])} | "
            f"{_fmt(aft['median_s'])} | {_fmt(aft['max_s'])} |"
        )
    g = chaos["garbage"]
    lines += [
        "",
        f"Garbage: {g['corrupted_answers']} corrupted answers "
        f"({', '.join(f'{k}: {v}' for k, v in g['by_kind'].items())}); "
        f"the broker logged {sum(g['broker_bad_answers_by_field'].values())} bad answers, by field "
        f"{g['broker_bad_answers_by_field']} (expected {g['expected_by_field']}).",
        "",
        "## What did not meet the target",
        "",
    ]
    failed = [name for name, ok in chaos["verdict"].items() if not ok]
    if base:
        failed += [f"baseline: {name}" for name, ok in base["verdict"].items() if not ok]
    lines += [f"- {name}" for name in failed] or ["Nothing: every target above was met."]
    notes = result.get("notes") or []
    if notes:
        lines += ["", "## Notes", "", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


def notes_for(result: dict) -> list[str]:
    """Plain statements of what the figures show beyond the verdict."""
    chaos, notes = result["runs"]["chaos"], []
    b = chaos["batches"]
    if b["refused_stale_calls"]:
        notes.append(
            f"{b['refused_stale_calls']} SubmitBatch call(s) refused as stale: the learner was at another version "
            "when the batch arrived (a restart from a checkpoint); the broker dropped the batch and sampled again."
        )
    if b["learner_versions_vs_accepted"]:
        notes.append(
            f"The learner's final version is {b['learner_versions_vs_accepted']:+d} against the batches it "
            "acknowledged: an update was trained (and checkpointed) but its answer never reached the broker."
        )
    late = chaos["run_ended_before_recovery"]
    if late:
        notes.append(
            f"Not counted as recoveries: {late} (fault kind: count), whose target was back less than a stall "
            "timeout before the run ended; the broker had no round left to take it back."
        )
    described = chaos["failed_describes"]
    if described["count"]:
        notes.append(
            f"{described['count']} readmission attempt(s) (Describe) to frozen simulators failed, "
            f"{described['total_s']:.1f} s in all: the broker awaits them at a round start "
            "(broker/samplers/lockstep.py `_start_round` -> `pool.readmit_due`), so the other simulators' "
            "slots wait as long."
        )
    for event in chaos["fault_events"]:
        if event["kind"] == "learner-kill":
            notes.append(
                f"The learner was SIGKILLed at iteration {event['iteration']} "
                + ("while it served a SubmitBatch; " if event.get("batch_in_flight") else "between SubmitBatch calls; ")
                + f"it was listening again {event['restart_s']:.1f} s later, resumed from its checkpoint. "
                f"{b['sent_again_accepted']} batch(es) were sent again after a failed call and accepted "
                "(an update cut by the kill is not in the checkpoint: the learner resumes at the batch's version)."
            )
    learner = chaos["recovery_after_resume"].get("learner-kill")
    if learner and learner["max_s"] is not None:
        notes.append(
            f"After the restarted learner listened, the broker's next call reached it {learner['max_s']:.1f} s "
            "later at most: its retry waits double up to 5 s (broker/run.py `_submit`)."
        )
    if chaos["faults_not_injected"]:
        notes.append(f"{len(chaos['faults_not_injected'])} planned fault(s) did not fire before the run ended.")
    if chaos["broker_tail"]:
        notes.append("The broker's last lines: " + " | ".join(chaos["broker_tail"]))
    return notes


async def main_async(cfg: ChaosConfig, out: Path | None, command: str, log) -> dict:
    started = time.monotonic()
    ctx = context()
    ctx["load_average_start"] = ctx.pop("load_average")
    plan = make_plan(cfg)
    kinds = {k: sum(1 for f in plan if f.kind == k) for k in ("sim-kill", "sim-stop", "garbage", "learner-kill")}
    log(f"chaos benchmark: {ctx['cores']} cores, load {ctx['load_average_start'][0]:.1f}; plan {kinds}")
    runs = {}
    work = Path(tempfile.mkdtemp(prefix="fast-chaos-"))
    try:
        with temporary_job_token() as token:
            if cfg.baseline:
                runs["baseline"] = await run_once(cfg, [], "baseline", work / "baseline", token, log)
                _print_run(runs["baseline"], log)
            runs["chaos"] = await run_once(cfg, plan, "chaos", work / "chaos", token, log)
            _print_run(runs["chaos"], log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ctx["load_average_end"] = os.getloadavg()
    result = {
        "command": command,
        "config": asdict(cfg),
        "plan": [asdict(f) for f in plan],
        "context": ctx,
        "wall_clock_s": time.monotonic() - started,
        "runs": runs,
    }
    base, chaos = runs.get("baseline"), runs["chaos"]
    if base and base["valid_per_s"] and chaos["valid_per_s"]:
        result["throughput_ratio"] = chaos["valid_per_s"] / base["valid_per_s"]
        log(f"throughput with faults / without: {result['throughput_ratio']:.2f}")
    result["notes"] = notes_for(result)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "chaos.json").write_text(json.dumps(result, indent=1, default=_json_default))
        (out / "chaos.md").write_text(markdown(result))
        log(f"wrote {out / 'chaos.json'} and {out / 'chaos.md'}")
    return result


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _print_run(r: dict, log) -> None:
    log(
        f"{r['label']}: {r['iterations_done']}/{r['iterations_asked']} iterations, "
        f"broker exit {r['broker_exit_code']}, "
        f"{_fmt(r['valid_per_s'], 0)} valid/s over {_fmt(r['training_window_s'], 1)} s; faults {r['faults_injected']}"
    )
    if r["fault_events"]:
        log(f"  faults: {_fault_counts(r)}")
    for kind, s in r["recovery"].items():
        log(f"  recovery {kind}: n={s['count']} median {_fmt(s['median_s'])} s, max {_fmt(s['max_s'])} s")
    log(f"  batches {r['batches']}")
    log(f"  corruption {r['corruption']}")
    log(f"  longest gap {r['progress']['longest_gap_s']:.1f} s; hangs {len(r['progress']['hangs'])}")
    for name, ok in r["verdict"].items():
        log(f"  {'ok ' if ok else 'NOT MET'} {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = ChaosConfig()
    for name in ("iterations", "samples", "servers", "slots", "seed", "kills", "stops", "learner_kills"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    for name in ("garbage_s", "step_timeout_s", "stall_timeout_s", "run_timeout_s"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, default=getattr(defaults, name))
    parser.add_argument("--preset", default=defaults.preset, choices=("off", "step-only"))
    parser.add_argument("--no-baseline", action="store_true", help="skip the run without faults")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    values = {k: v for k, v in vars(args).items() if k not in ("no_baseline", "out")}
    cfg = ChaosConfig(**values, baseline=not args.no_baseline)
    lines: list[str] = []

    def log(message: str) -> None:
        print(message, flush=True)
        lines.append(message)

    command = "python benchmarks/chaos.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result = asyncio.run(main_async(cfg, args.out, command.strip(), log))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "run.log").write_text("\n".join(lines) + "\n")
    return 0 if all(result["runs"]["chaos"]["verdict"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())

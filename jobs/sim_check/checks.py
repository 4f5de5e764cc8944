"""The checks of `fast sim-check`: does a simulator server keep the fast.v1 contract?

Each check is an async function of a `Target` that returns rows (`Result`): pass, fail (with a
one-line fix), warn (the broker accepts it, but look), or skip (with why). `run_checks` runs them
in order against one server and returns a `Report`; the figures (latency, throughput) are measured
last, then the drain on SIGTERM when the server's pid is given, which stops the server.

The rules are the project's own: spaces decode by fast/spaces.py, answers are judged by
broker/answers.py (what a run's broker accepts), and the error contract is the one of
protos/fast/v1/simulator.proto and docs/simulator_api.md ("Errors are part of the contract").
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from typing import Awaitable, Callable

import grpc
import numpy as np
from grpc_health.v1 import health_pb2

from broker import answers
from fast import tensor
from fast.lifecycle import process_alive
from fast.quoting import quote, shorten
from fast.rpc import Credentials
from fast.spaces import describe_space, space_from_proto
from fast.v1 import simulator_pb2 as pb
from fast.v1 import tensor_pb2 as tpb
from jobs.sim_check.target import (
    MAX_MESSAGE_BYTES,
    OK,
    BadAnswer,
    Options,
    Target,
    UsageError,
    decode_step,
    ended_mask,
    field_of,
    reset_verdicts,
    rpc_text,
    step_verdicts,
)
from sim_server.client import LocalStepStream, ServerDescription

PASS, FAIL, WARN, SKIP = "pass", "fail", "warn", "skip"
SERVICE = pb.DESCRIPTOR.services_by_name["Simulator"].full_name
DOCS = "as docs/simulator_api.md says"
# The check groups that need a working Reset, in the order they run.
AFTER_RESET = (
    "determinism", "batched", "step", "errors", "deadlines", "stream", "local_step", "prefetch", "drain"
)  # fmt: skip
Code = grpc.StatusCode


@dataclass
class Result:
    check: str  # the group: health, describe, reset, ...
    name: str  # what this row checks
    status: str  # pass | fail | warn | skip
    detail: str = ""  # what was seen, or why it was skipped
    fix: str = ""  # for a failure (or a warning): what to change, in one line


@dataclass
class Figure:
    """A measured figure: latency of one kind of call, and throughput. Not pass/fail."""

    name: str
    slots: int  # slots per call
    calls: int
    median_ms: float
    p95_ms: float
    calls_per_s: float
    slot_steps_per_s: float | None = None  # for Step figures: slots x calls per second


@dataclass
class Report:
    address: str
    env_id: str = ""
    results: list[Result] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    elapsed_s: float = 0.0

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def exit_code(self) -> int:
        return 1 if self.count(FAIL) else 0

    def to_json(self) -> dict:
        return {
            "address": self.address,
            "env_id": self.env_id,
            "summary": {
                "passed": self.count(PASS),
                "failed": self.count(FAIL),
                "skipped": self.count(SKIP),
                "warnings": self.count(WARN),
            },
            "exit_code": self.exit_code,
            "elapsed_s": round(self.elapsed_s, 3),
            "results": [asdict(r) for r in self.results],
            "figures": [asdict(f) for f in self.figures],
        }


def ok(check: str, name: str, detail: str = "") -> Result:
    return Result(check, name, PASS, detail)


def bad(check: str, name: str, detail: str, fix: str) -> Result:
    return Result(check, name, FAIL, detail, fix)


def warn(check: str, name: str, detail: str, fix: str) -> Result:
    return Result(check, name, WARN, detail, fix)


def skip(check: str, name: str, why: str) -> Result:
    return Result(check, name, SKIP, f"skipped: {why}")


# One fix per field of an answer that broker/answers.py judges.
ANSWER_ROWS = {
    "request_id": ("request_id echoed", "copy the request's request_id into its StepResponse"),
    "slot_ids": ("slot_ids are those asked, in order", f"answer the slot_ids asked, in the order asked, {DOCS}"),
    "observations": (
        "observations [k, *obs_shape] of the space's dtype, finite",
        "send observations as one [k, *obs_shape] tensor of the observation space's dtype, finite for a float "
        f"Box and in [0, n) for a Discrete, {DOCS}",
    ),
    "rewards": ("rewards float [k], finite", "send rewards as a float32 [k] tensor of finite values (no NaN or inf)"),
    "flags": (
        "terminated and truncated bool [k], never both true",
        "send terminated and truncated as bool [k] tensors and never both true for one slot: terminated when the "
        f"task ended the episode, truncated when a time limit cut it, {DOCS}",
    ),
    "episodes": (
        "one EpisodeSummary per slot that ended, none for another",
        "add one EpisodeSummary per slot whose episode ended in that step (terminated as its flag, no NaN) and "
        f"none for another, {DOCS}",
    ),
    "timing": (
        "timing finite, not negative",
        "fill ServerTiming with finite, non-negative seconds (or leave it unset)",
    ),
    "other": ("answer the broker accepts", f"answer as protos/fast/v1/simulator.proto says, {DOCS}"),
}
FIX_DETERMINISM = (
    "derive every random draw of an episode from its Reset's clip id and seed only (not from the slot, the "
    f"clock or other slots), so that the same clip, seed and actions give the same trajectory, {DOCS}"
)
FIX_SERVING = "keep serving after refusing a request: answer its status and change nothing"
FIX_SLOTS_BACK = (
    "give a call's slots back when its deadline passes or the client cancels it, so that the next Reset of "
    "those slots works"
)


def _answer_rows(check: str, what: str, verdicts: dict[str, str], fields: tuple[str, ...]) -> list[Result]:
    """Rows of `fields` for one judged answer: the broker's sentence and the fix for each field it refused."""
    rows = []
    for name in fields:
        label, fix = ANSWER_ROWS[name]
        if name in verdicts:
            rows.append(bad(check, f"{what}: {label}", verdicts[name], fix))
        elif name not in ("request_id", "other"):
            rows.append(ok(check, f"{what}: {label}"))
    return rows


def _first_problem(verdicts: dict[str, str]) -> tuple[str, str]:
    """(the broker's sentence, the fix) of the first field refused."""
    name, problem = next(iter(verdicts.items()))
    return problem, ANSWER_ROWS[name][1]


# -- health and Describe ---------------------------------------------------------------------------


async def check_health(t: Target) -> list[Result]:
    fix = (
        f'serve grpc.health.v1.Health without a token and mark "" and "{SERVICE}" SERVING once ready '
        "(fast/rpc.py start_server does)"
    )
    rows = []
    for service in ("", SERVICE):
        name = f"Check({service!r}) answers SERVING"
        try:
            reply = await t.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=t.timeout)
        except grpc.aio.AioRpcError as exc:
            rows.append(bad("health", name, rpc_text(exc), fix))
            continue
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        serving = reply.status == health_pb2.HealthCheckResponse.SERVING
        rows.append(ok("health", name, status) if serving else bad("health", name, f"answered {status}", fix))
    return rows


async def check_describe(t: Target) -> list[Result]:
    """Describe's answer: spaces the broker can use, slots and catalog, capabilities. Sets `t.desc`."""
    try:
        r = await t.stub.Describe(pb.DescribeRequest(), timeout=t.timeout)
    except grpc.aio.AioRpcError as exc:
        if exc.code() == Code.UNAUTHENTICATED:
            raise UsageError(
                f"{t.address} refused the run token ({rpc_text(exc)}); give the server's token with --token-file "
                "(or FAST_AUTH_TOKEN / FAST_AUTH_TOKEN_FILE), docs/security.md"
            ) from None
        return [bad("describe", "Describe answers", rpc_text(exc), f"implement Describe, {DOCS}")]
    rows = [ok("describe", "Describe answers", f"env {r.env_id!r}, server {r.server_version!r}")]
    fix_space = (
        "describe a Box with low and high exactly of its shape and dtype (no NaN, low <= high, every dimension "
        f">= 1) or a Discrete with n >= 1, {DOCS}"
    )
    spaces = {}
    for name in ("observation_space", "action_space"):
        try:
            spaces[name] = space_from_proto(getattr(r, name), field=name)
        except tensor.TensorError as exc:
            rows.append(bad("describe", f"{name} usable", str(exc), fix_space))
        else:
            rows.append(ok("describe", f"{name} usable", describe_space(spaces[name])))
    desc = ServerDescription(
        env_id=r.env_id,
        observation_space=spaces.get("observation_space"),  # type: ignore[arg-type]
        action_space=spaces.get("action_space"),  # type: ignore[arg-type]
        num_slots=r.num_slots,
        num_clips=r.num_clips,
        cost_model=r.capabilities.cost_model,
        server_version=r.server_version,
    )
    problem = answers.description_problem(desc)
    name = "num_slots and num_clips"
    if problem:
        rows.append(
            bad("describe", name, problem, f"describe 1 to {answers.MAX_SLOTS_PER_SERVER} slots and at least 1 clip")
        )
    else:
        rows.append(ok("describe", name, f"{r.num_slots} slots, {r.num_clips} clips"))
    caps = r.capabilities
    t.capabilities = caps
    detail = (
        f"batched_reset={caps.batched_reset}, streaming_step={caps.streaming_step}, "
        f"cost model {caps.cost_model.preset or '(unnamed)'!r}, api_version {r.api_version!r}"
    )
    if r.api_version != "fast.v1":
        rows.append(warn("describe", "capabilities and api_version", detail, 'set api_version to "fast.v1"'))
    else:
        rows.append(ok("describe", "capabilities and api_version", detail))
    if len(spaces) == 2 and not problem:
        t.desc = desc
    return rows


# -- Reset, determinism, batching --------------------------------------------------------------------


async def probe_never_reset(t: Target) -> Result:
    """Step a slot before anything reset it: FAILED_PRECONDITION, unless an earlier client left it live."""
    name = "Step: a slot never reset -> FAILED_PRECONDITION"
    slot = t.num_slots - 1
    code, details = await t.status_of(t.step_call([slot], t.actions(1)))
    if code == Code.FAILED_PRECONDITION:
        return ok("errors", name, f"{code.name}: {shorten(details, 100)}")
    if code == OK:
        return skip(
            "errors",
            name,
            f"answered OK: slot {slot} may hold an episode an earlier client started; check a freshly started server",
        )
    return bad(
        "errors",
        name,
        f"answered {code.name} ({shorten(details, 100)}), expected FAILED_PRECONDITION",
        f'answer FAILED_PRECONDITION for stepping a slot that has no live episode ("Reset it first"), {DOCS}',
    )


async def check_reset(t: Target) -> list[Result]:
    """One Reset of every slot with clips and seeds: the answer the broker accepts."""
    n = t.num_slots
    what = f"Reset of all {n} slots"
    try:
        reply = await t.reset(t.slots, t.clips(n), t.seeds(n))
    except grpc.aio.AioRpcError as exc:
        return [
            bad("reset", what, rpc_text(exc), f"accept a Reset of any set of slots with one clip and seed each, {DOCS}")
        ]
    except BadAnswer as exc:
        return [bad("reset", f"{what}: the answer decodes", str(exc), ANSWER_ROWS[field_of(str(exc))][1])]
    verdicts = reset_verdicts(reply, t.slots, t.desc.observation_space)
    return _answer_rows("reset", what, verdicts, ("slot_ids", "observations", "timing", "other"))


Record = tuple[bytes, ...]


async def _trajectory(
    t: Target, slot: int, clip: int, seed: int, actions: np.ndarray, others: bool
) -> tuple[list[Record], str]:
    """Reset `slot` with (clip, seed) and step it with `actions`; the raw bytes of every answer.

    With `others`, every other slot is reset in the same call with other clips and stepped alongside
    with random actions (a slot's trajectory must not depend on its neighbours or on batching).
    """
    slots = t.slots if others else np.array([slot])
    clips = t.clips(slots.size)
    seeds = t.seeds(slots.size)
    mine = int(np.flatnonzero(slots == slot)[0])
    clips[mine], seeds[mine] = clip, seed
    first = await t.reset(slots, clips, seeds)
    if first.observations.shape[:1] != (slots.size,):
        return [], "the Reset answer has the wrong shape"
    records: list[Record] = [(first.observations[mine].tobytes(),)]
    live = np.ones(slots.size, dtype=bool)
    for i in range(actions.shape[0]):
        acting = slots[live]
        step_actions = t.actions(acting.size)
        j = int(np.flatnonzero(acting == slot)[0])
        step_actions[j] = actions[i]
        r = await t.step(acting, step_actions)
        k = acting.size
        if r.observations.shape[:1] != (k,) or r.rewards.shape != (k,):
            return records, f"the answer of step {i + 1} has the wrong shape"
        records.append(
            (
                r.observations[j].tobytes(),
                r.rewards[j].tobytes(),
                r.terminated[j : j + 1].tobytes(),
                r.truncated[j : j + 1].tobytes(),
            )
        )
        ended = ended_mask(r, k)
        if ended[j]:
            break
        live[np.flatnonzero(live)[ended]] = False
    return records, ""


def _steps(count: int) -> str:
    return f"{count} step{'s' if count != 1 else ''}"


def _first_difference(a: list[Record], b: list[Record]) -> str:
    parts = ("observation", "reward", "terminated", "truncated")
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            what = next(parts[p] for p in range(len(x)) if x[p] != y[p])
            return "the first observation differs" if i == 0 else f"step {i}'s {what} differs"
    return f"one ran {len(a) - 1} steps, the other {len(b) - 1}"


async def check_determinism(t: Target) -> tuple[list[Result], bool]:
    """The same clip, seed and actions give the same trajectory: on one slot twice, and on another slot
    reset and stepped in a batch with every other slot. Returns the rows and whether the first held."""
    steps = 20
    clip, seed = int(t.clips(1)[0]), int(t.seeds(1)[0])
    actions = t.actions(steps)
    a, why = await _trajectory(t, 0, clip, seed, actions, others=False)
    b, why_b = await _trajectory(t, 0, clip, seed, actions, others=False)
    name = f"same clip, seed and actions: same trajectory (slot 0, twice, {steps} steps)"
    rows = []
    same = a == b and not (why or why_b)
    if same:
        rows.append(ok("determinism", name, f"clip {clip}, seed {seed}: {_steps(len(a) - 1)} identical"))
    else:
        detail = why or why_b or f"clip {clip}, seed {seed}: {_first_difference(a, b)} on the second run"
        rows.append(bad("determinism", name, detail, FIX_DETERMINISM))
    name = f"same trajectory on another slot, reset and stepped with all {t.num_slots} slots"
    if t.num_slots < 2:
        rows.append(skip("determinism", name, "the server has one slot"))
        return rows, same
    c, why_c = await _trajectory(t, t.num_slots - 1, clip, seed, actions, others=True)
    if not same:
        rows.append(skip("determinism", name, "not deterministic on one slot already"))
    elif c == a and not why_c:
        rows.append(ok("determinism", name, f"slot {t.num_slots - 1}: {_steps(len(c) - 1)} identical to slot 0's"))
    else:
        detail = why_c or f"slot {t.num_slots - 1}: {_first_difference(a, c)} from slot 0's"
        rows.append(bad("determinism", name, detail, FIX_DETERMINISM))
    return rows, same


async def check_batched(t: Target) -> list[Result]:
    """One Step of all slots, a Reset and a Step of a subset out of order: answers the broker accepts."""
    n = t.num_slots
    subset = t.slots[::-1][::2] if n > 1 else t.slots
    space = t.desc.observation_space
    fix_call = f"accept any set of slots in one call, in any order, and answer them in the order asked, {DOCS}"
    rows = []
    await t.reset(t.slots, t.clips(n), t.seeds(n))

    async def judged(what: str, call: Callable[[], Awaitable], judge, asked: np.ndarray) -> None:
        try:
            reply = await call()
        except grpc.aio.AioRpcError as exc:
            rows.append(bad("batched", what, rpc_text(exc), fix_call))
            return
        except BadAnswer as exc:
            rows.append(bad("batched", what, str(exc), ANSWER_ROWS[field_of(str(exc))][1]))
            return
        verdicts = {name: p for name, p in judge(reply, asked, space).items() if _about_batching(name, p)}
        if verdicts:
            rows.append(bad("batched", what, *_first_problem(verdicts)))
        else:
            rows.append(ok("batched", what, f"{asked.size} slots answered in the order asked"))

    await judged(f"Step of all {n} slots in one call", lambda: t.step(t.slots, t.actions(n)), step_verdicts, t.slots)
    listed = quote(subset.tolist())
    await judged(
        f"Reset of slots {listed} in one call",
        lambda: t.reset(subset, t.clips(subset.size), t.seeds(subset.size)),
        reset_verdicts,
        subset,
    )
    await judged(
        f"Step of slots {listed} in one call",
        lambda: t.step(subset, t.actions(subset.size)),
        step_verdicts,
        subset,
    )
    return rows


def _about_batching(name: str, problem: str) -> bool:
    """Whether a refused field is about the k slots of a call (which slots, how many rows), not about
    the values in them (the step rows judge those)."""
    return name in ("slot_ids", "request_id") or (
        name in ("observations", "rewards", "flags") and ": expected " in problem
    )


# -- Step semantics ----------------------------------------------------------------------------------


async def check_step_semantics(t: Target) -> list[Result]:
    """A few hundred lock-step steps of every slot with random actions, ended slots reset as they end:
    every answer judged by the broker's rules, summaries checked against what was played, the first
    ended slot stepped again without a Reset, observations compared with the space's bounds."""
    n, opts = t.num_slots, t.options
    slots = t.slots
    space = t.desc.observation_space
    check = "step"
    clip_of = t.clips(n)
    await t.reset(slots, clip_of, t.seeds(n))
    length = np.zeros(n, dtype=np.int64)
    problems: dict[str, tuple[int, str]] = {}  # field -> (answers refused, the first sentence)
    summary_problem, outside, outside_first = "", 0, ""
    ended_probe: Result | None = None
    episodes, steps, error = 0, 0, ""
    give_up = time.monotonic() + opts.semantics_budget_s
    low = high = None
    if space.kind == "box":
        low, high = space.low.reshape(1, -1), space.high.reshape(1, -1)
    while time.monotonic() < give_up and (steps < opts.steps or (ended_probe is None and steps < 10 * opts.steps)):
        try:
            reply = await t.step(slots, t.actions(n))
        except grpc.aio.AioRpcError as exc:
            error = f"Step {steps + 1} of all {n} slots failed: {rpc_text(exc)}"
            break
        except BadAnswer as exc:
            field_name = field_of(str(exc))
            count, first = problems.get(field_name, (0, f"does not decode: {exc}"))
            problems[field_name] = (count + 1, first)
            steps += 1
            clip_of = t.clips(n)
            await t.reset(slots, clip_of, t.seeds(n))  # its slots' states are unknown: start over
            length[:] = 0
            continue
        steps += 1
        length += 1
        for name, problem in step_verdicts(reply, slots, space).items():
            count, first = problems.get(name, (0, problem))
            problems[name] = (count + 1, first)
        observations = reply.observations
        if low is not None and observations.shape == (n, *space.shape):
            flat = observations.reshape(n, -1)
            out_rows = np.flatnonzero(((flat < low) | (flat > high)).any(axis=1))
            if out_rows.size:
                outside += int(out_rows.size)
                if not outside_first:
                    j = int(out_rows[0])
                    e = int(np.flatnonzero((flat[j] < low[0]) | (flat[j] > high[0]))[0])
                    outside_first = (
                        f"slot {j}, element {e} = {flat[j, e].item()} outside [{low[0, e].item()}, {high[0, e].item()}]"
                    )
        ended = ended_mask(reply, n)
        for episode in reply.episodes:
            slot = episode.slot_id
            if 0 <= slot < n and ended[slot] and not summary_problem:
                if episode.clip_id != clip_of[slot]:
                    summary_problem = f"slot {slot}'s summary names clip {episode.clip_id}; it played {clip_of[slot]}"
                elif episode.length != length[slot]:
                    summary_problem = f"slot {slot}'s summary says length {episode.length}; it ran {length[slot]} steps"
        if not ended.any():
            continue
        episodes += int(ended.sum())
        done = slots[ended]
        if ended_probe is None:
            ended_probe = await _probe_ended(t, int(done[0]))
        clip_of[done] = t.clips(done.size)
        length[done] = 0
        await t.reset(done, clip_of[done], t.seeds(done.size))
    what = f"{steps} steps of {n} slots"
    rows = []
    if error:
        rows.append(bad(check, f"Step of all {n} slots, repeatedly", error, f"answer every valid Step, {DOCS}"))
    for name in ("slot_ids", "observations", "rewards", "flags", "episodes", "timing", "request_id", "other"):
        label, fix = ANSWER_ROWS[name]
        if name in problems:
            count, first = problems[name]
            rows.append(bad(check, f"answers: {label}", f"{count} of {steps} answers refused; first: {first}", fix))
        elif name not in ("request_id", "other"):
            rows.append(ok(check, f"answers: {label}", f"{what}, {episodes} episodes ended"))
    name = "EpisodeSummary names the slot's clip and episode length"
    if summary_problem:
        rows.append(
            warn(
                check,
                name,
                summary_problem,
                "set EpisodeSummary.clip_id to the clip the slot played and length to its number of steps",
            )
        )
    elif episodes:
        rows.append(ok(check, name, f"{episodes} summaries"))
    else:
        rows.append(skip(check, name, f"no episode ended in {what}"))
    name = "observations within the observation space's bounds"
    if space.kind != "box":
        rows.append(skip(check, name, f"the space is {describe_space(space)}"))
    elif outside:
        rows.append(
            warn(
                check,
                name,
                f"{outside} observations outside the bounds ({outside_first}); the broker accepts them",
                "widen the observation space's bounds to what the simulator produces, or clip observations",
            )
        )
    else:
        rows.append(ok(check, name, what))
    name = "Step of an ended slot without Reset -> FAILED_PRECONDITION"
    rows.append(ended_probe or skip(check, name, f"no episode ended in {what}"))
    return rows


async def _probe_ended(t: Target, slot: int) -> Result:
    name = "Step of an ended slot without Reset -> FAILED_PRECONDITION"
    code, details = await t.status_of(t.step_call([slot], t.actions(1)))
    if code == Code.FAILED_PRECONDITION:
        return ok("step", name, f"slot {slot}: {code.name}: {shorten(details, 100)}")
    return bad(
        "step",
        name,
        f"slot {slot}, whose episode had ended: answered {code.name}, expected FAILED_PRECONDITION",
        f"answer FAILED_PRECONDITION for a Step of a slot whose episode ended until it is Reset, {DOCS}",
    )


# -- the error contract --------------------------------------------------------------------------------


@dataclass
class _Case:
    name: str
    expected: grpc.StatusCode
    call: Callable[[], Awaitable] | None  # None: does not apply to this server
    fix: str
    why_not: str = ""
    steps: bool = False  # a Step case: needs slot 0 live


def _error_cases(t: Target) -> list[_Case]:
    n, clips = t.num_slots, t.desc.num_clips
    act = t.desc.action_space
    clip = int(t.clips(1)[0])
    one = lambda: t.actions(1)  # noqa: E731
    inv, nf = Code.INVALID_ARGUMENT, Code.NOT_FOUND
    fix_slot = f"answer NOT_FOUND for a slot id outside 0..num_slots-1, {DOCS}"
    fix_clip = f"answer NOT_FOUND for a clip id outside 0..num_clips-1, {DOCS}"
    fix_twice = f"answer INVALID_ARGUMENT for a slot repeated in slot_ids, {DOCS}"
    fix_lengths = (
        f"answer INVALID_ARGUMENT when clip_ids (or seeds, when given) do not match slot_ids one to one, {DOCS}"
    )
    fix_empty = f"answer INVALID_ARGUMENT for an empty slot_ids, {DOCS}"
    fix_action = (
        "answer INVALID_ARGUMENT for actions not of shape [k, *action_shape] in the action space's dtype, "
        f"naming expected and received, {DOCS}"
    )
    fix_value = f"answer INVALID_ARGUMENT for a NaN, inf or out-of-bounds action, naming the slot, {DOCS}"
    fix_tensor = f"answer INVALID_ARGUMENT for an actions tensor that does not decode, {DOCS}"

    def raw_step(slots: list[int], actions: tpb.Tensor) -> Callable[[], Awaitable]:
        return lambda: t.stub.Step(pb.StepRequest(slot_ids=slots, actions=actions), timeout=t.timeout)

    wrong_shape = _misshapen(act).shape
    wrong_dtype = np.float64 if np.dtype(act.dtype) != np.float64 else np.float32
    cases = [
        _Case("Reset: slot id = num_slots", nf, lambda: t.reset_call([n], [clip]), fix_slot),
        _Case("Reset: slot id -1", nf, lambda: t.reset_call([-1], [clip]), fix_slot),
        _Case("Reset: a slot id twice", inv, lambda: t.reset_call([0, 0], [clip, clip]), fix_twice),
        _Case("Reset: clip id = num_clips", nf, lambda: t.reset_call([0], [clips]), fix_clip),
        _Case("Reset: clip id -1", nf, lambda: t.reset_call([0], [-1]), fix_clip),
        _Case("Reset: no clip_ids for a slot", inv, lambda: t.reset_call([0], []), fix_lengths),
        _Case("Reset: more seeds than slot_ids", inv, lambda: t.reset_call([0], [clip], [1, 2]), fix_lengths),
        _Case("Reset: empty slot_ids", inv, lambda: t.reset_call([], []), fix_empty),
        _Case("Step: slot id = num_slots", nf, lambda: t.step_call([n], one()), fix_slot, steps=True),
        _Case("Step: slot id -1", nf, lambda: t.step_call([-1], one()), fix_slot, steps=True),
        _Case("Step: a slot id twice", inv, lambda: t.step_call([0, 0], t.actions(2)), fix_twice, steps=True),
        _Case("Step: empty slot_ids", inv, lambda: t.step_call([], t.actions(0)), fix_empty, steps=True),
        _Case(
            f"Step: actions of shape {list(wrong_shape)}",
            inv,
            lambda: t.step_call([0], _misshapen(act)),
            fix_action,
            steps=True,
        ),
        _Case(
            f"Step: actions of dtype {np.dtype(wrong_dtype).name}",
            inv,
            lambda: t.step_call([0], one().astype(wrong_dtype)),
            fix_action,
            steps=True,
        ),
    ]
    name = "Step: a NaN action"
    if act.kind == "box" and np.dtype(act.dtype).kind == "f":
        nan = lambda: np.full((1, *act.shape), np.nan, dtype=act.dtype)  # noqa: E731
        cases.append(_Case(name, inv, lambda: t.step_call([0], nan()), fix_value, steps=True))
    else:
        cases.append(_Case(name, inv, None, fix_value, why_not=f"the action space is {describe_space(act)}"))
    name = "Step: an action outside the space's bounds"
    outside = _outside_action(act)
    if outside is not None:
        cases.append(_Case(name, inv, lambda: t.step_call([0], outside), fix_value, steps=True))
    else:
        cases.append(_Case(name, inv, None, fix_value, why_not="the action space has no finite upper bound"))
    wire = tensor.to_proto(one())
    short = tpb.Tensor(dtype=wire.dtype, shape=wire.shape, data=wire.data[:-1])
    unknown = tpb.Tensor(dtype=99, shape=wire.shape, data=wire.data)
    cases += [
        _Case("Step: actions whose bytes do not fit their shape", inv, raw_step([0], short), fix_tensor, steps=True),
        _Case("Step: actions of an unknown dtype", inv, raw_step([0], unknown), fix_tensor, steps=True),
    ]
    return cases


def _misshapen(space) -> np.ndarray:
    """One action of the space's dtype with a wrong shape: the last dimension one longer ([1, 1] for a scalar)."""
    shape = (1, *space.shape[:-1], space.shape[-1] + 1) if space.shape else (1, 1)
    return np.zeros(shape, dtype=space.dtype)


def _outside_action(space) -> np.ndarray | None:
    """One action just outside the space (n for a Discrete, above `high` for a Box), if there is one."""
    if space.kind == "discrete":
        return np.array([space.n], dtype=np.int64)
    high = space.high.reshape(-1)
    finite = np.flatnonzero(np.isfinite(high))
    if not finite.size:
        return None
    e = int(finite[0])
    value = float(high[e]) + max(1.0, abs(float(high[e])))
    dtype = np.dtype(space.dtype)
    limit = np.finfo(dtype).max if dtype.kind == "f" else np.iinfo(dtype).max
    if value > float(limit):
        return None
    action = np.clip(np.zeros(space.shape), space.low, space.high).astype(dtype).reshape(1, -1)
    action[0, e] = value
    return action.reshape(1, *space.shape)


async def check_errors(t: Target) -> list[Result]:
    """Every documented bad request gets its documented status, and the server serves on."""
    rows = []
    clip = int(t.clips(1)[0])
    await t.reset([0], [clip], [0])
    live = True
    for case in _error_cases(t):
        name = f"{case.name} -> {case.expected.name}"
        if case.call is None:
            rows.append(skip("errors", name, case.why_not))
            continue
        if case.steps and not live:
            await t.reset([0], [clip], [0])  # an earlier case was not refused and may have stepped it
            live = True
        code, details = await t.status_of(case.call())
        live = live and code != OK
        serving = await t.serving()
        if code != case.expected:
            seen = f"answered {code.name}" + (f" ({shorten(details, 100)})" if details else "")
            rows.append(bad("errors", name, f"{seen}, expected {case.expected.name}", case.fix))
        elif serving:
            rows.append(bad("errors", name, f"refused as documented, but {serving}", FIX_SERVING))
        elif not details:
            rows.append(
                warn(
                    "errors", name, f"{code.name} without a message", "say in the message which slot or field is wrong"
                )
            )
        else:
            rows.append(ok("errors", name, shorten(details, 100)))
    rows.append(await _check_busy(t))
    return rows


async def _check_busy(t: Target) -> Result:
    """Concurrent Steps of one slot: each answers OK (served one after another) or FAILED_PRECONDITION (busy)."""
    name = "Step: one slot in 8 concurrent calls -> OK or FAILED_PRECONDITION"
    await t.reset([0], t.clips(1), [0])
    codes = await asyncio.gather(*(t.status_of(t.step_call([0], t.actions(1))) for _ in range(8)))
    counts: dict[str, int] = {}
    for code, _ in codes:
        counts[code.name] = counts.get(code.name, 0) + 1
    seen = ", ".join(f"{count} {code}" for code, count in sorted(counts.items()))
    others = [(c, d) for c, d in codes if c not in (OK, Code.FAILED_PRECONDITION)]
    serving = await t.serving()
    if others:
        code, details = others[0]
        return bad(
            "errors",
            name,
            f"{seen}; first other: {code.name} ({shorten(details, 100)})",
            "serve concurrent calls of one slot one after another, or answer FAILED_PRECONDITION while it is busy, "
            + DOCS,
        )
    if serving:
        return bad("errors", name, f"{seen}, but {serving}", FIX_SERVING)
    return ok("errors", name, seen)


async def check_refusals_change_nothing(t: Target, deterministic: bool) -> list[Result]:
    """A refused call leaves its slot as it was: refused calls between a Reset and its steps do not change
    the trajectory (which needs a deterministic server to tell)."""
    name = "refused calls leave the slot as it was"
    if not deterministic:
        return [skip("errors", name, "the server is not deterministic, so a change cannot be told apart")]
    steps = 5
    clip, seed = int(t.clips(1)[0]), int(t.seeds(1)[0])
    actions = t.actions(steps)
    reference, why = await _trajectory(t, 0, clip, seed, actions, others=False)
    first = await t.reset([0], [clip], [seed])
    act = t.desc.action_space
    wrong = _misshapen(act)
    refused = [
        await t.status_of(t.step_call([0], wrong)),
        await t.status_of(t.step_call([0, t.num_slots], t.actions(2))),
        await t.status_of(t.reset_call([0], [t.desc.num_clips], [seed + 1])),
        await t.status_of(t.reset_call([0, 0], [clip, clip], [seed + 1, seed + 1])),
    ]
    if any(code == OK for code, _ in refused):
        return [skip("errors", name, "the server did not refuse every bad request (see the rows above)")]
    if first.observations.shape[:1] != (1,):
        return [skip("errors", name, "the Reset answer has the wrong shape (see the rows above)")]
    records: list[Record] = [(first.observations[0].tobytes(),)]
    for i in range(len(reference) - 1):
        r = await t.step([0], actions[i : i + 1])
        records.append(
            (r.observations[0].tobytes(), r.rewards.tobytes(), r.terminated.tobytes(), r.truncated.tobytes())
        )
    if records == reference and not why:
        return [ok("errors", name, f"4 refused calls, then {len(records) - 1} steps as without them")]
    return [
        bad(
            "errors",
            name,
            f"after 4 refused calls {_first_difference(reference, records)} from the same episode without them",
            f"validate a whole request before changing anything: a refused call changes nothing, {DOCS}",
        )
    ]


# -- deadlines and cancellation ------------------------------------------------------------------------------


async def check_deadlines(t: Target) -> list[Result]:
    """A call with a 1 ms deadline, and one cancelled mid-flight, leave the server serving and its
    slots usable: Reset and Step of those slots work afterwards, answers the broker accepts."""
    n = t.num_slots
    slots = t.slots
    fix_status = (
        "end a call whose deadline passed with DEADLINE_EXCEEDED (or answer it), changing no slot when it is "
        f"refused, {DOCS}"
    )
    rows = []

    async def afterwards(name: str, allowed: tuple[grpc.StatusCode, ...], code: grpc.StatusCode, details: str):
        if code not in allowed:
            allowed_names = " or ".join(c.name for c in allowed)
            rows.append(
                bad(
                    "deadlines",
                    name,
                    f"ended {code.name} ({shorten(details, 100)}), expected {allowed_names}",
                    fix_status,
                )
            )
            return
        serving = await t.serving()
        if serving:
            rows.append(bad("deadlines", name, serving, FIX_SERVING))
            return
        try:
            await t.reset_when_free(slots, t.clips(n), t.seeds(n))
            await t.step(slots, t.actions(n))
        except grpc.aio.AioRpcError as exc:
            rows.append(bad("deadlines", name, f"then Reset and Step of all slots: {rpc_text(exc)}", FIX_SLOTS_BACK))
            return
        rows.append(ok("deadlines", name, f"ended {code.name}; then Reset and Step of all {n} slots work"))

    await t.reset(slots, t.clips(n), t.seeds(n))
    deadline = (OK, Code.DEADLINE_EXCEEDED)
    code, details = await t.status_of(t.step_call(slots, t.actions(n), timeout=0.001))
    await afterwards(f"Step of all {n} slots with a 1 ms deadline", deadline, code, details)
    # A server without batched_reset gets one slot per Reset, as the broker sends it.
    reset_slots = slots if t.capabilities.batched_reset else slots[:1]
    k = len(reset_slots)
    reset_what = f"Reset of all {n} slots" if k == n else "Reset of 1 slot (no batched_reset)"
    code, details = await t.status_of(t.reset_call(reset_slots, t.clips(k), t.seeds(k), timeout=0.001))
    await afterwards(f"{reset_what} with a 1 ms deadline", deadline, code, details)

    cancelled = (OK, Code.CANCELLED)
    for what, make in (
        (reset_what, lambda: t.reset_call(reset_slots, t.clips(k), t.seeds(k))),
        (f"Step of all {n} slots", lambda: t.step_call(slots, t.actions(n))),
    ):
        call = make()
        await asyncio.sleep(0.002)
        call.cancel()
        code, details = await t.status_of(call)
        await afterwards(f"{what} cancelled mid-flight", cancelled, code, details)
    name = "StepStream cancelled mid-flight"
    if not t.capabilities.streaming_step:
        rows.append(skip("deadlines", name, "StepStream not advertised"))
        return rows
    stream = t.stub.StepStream(timeout=t.timeout)
    await stream.write(pb.StepRequest(slot_ids=slots.tolist(), actions=tensor.to_proto(t.actions(n)), request_id=1))
    stream.cancel()
    code, details = await t.status_of(_stream_end(stream))
    await afterwards(name, cancelled, code, details)
    return rows


async def _stream_end(stream) -> None:
    """Read a stream to its end; raises its error status."""
    while await stream.read() is not grpc.aio.EOF:
        pass
    code = await stream.code()
    if code != OK:
        raise _StreamError(code, await stream.details())


class _StreamError(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


# -- StepStream ----------------------------------------------------------------------------------------------


async def check_stream(t: Target) -> list[Result]:
    """StepStream, when advertised: one answer per request, in order, request_id echoed, answers the
    broker accepts; an error ends the stream with its status."""
    names = (
        "StepStream: one answer per request, in order, request_id echoed",
        "StepStream: an error ends the stream with its status",
    )
    if not t.capabilities.streaming_step:
        why = "not advertised (Capabilities.streaming_step is false)"
        return [skip("stream", name, why) for name in names]
    n = t.num_slots
    slots = t.slots
    space = t.desc.observation_space
    rows = []
    await t.reset(slots, t.clips(n), t.seeds(n))
    stream = t.stub.StepStream(timeout=t.timeout * 3)
    sent = answered = 0
    problem = fix = ""
    next_id = 1000
    try:
        # One request of every slot, then rounds of one request per slot written before any answer is read.
        for batch in [[slots], *([[np.array([s]) for s in slots]] * 2)]:
            ids = []
            for asked in batch:
                next_id += 7
                ids.append(next_id)
                request = pb.StepRequest(
                    slot_ids=asked.tolist(), actions=tensor.to_proto(t.actions(asked.size)), request_id=next_id
                )
                await stream.write(request)
                sent += 1
            ended: list[int] = []
            for asked, request_id in zip(batch, ids):
                response = await stream.read()
                if response is grpc.aio.EOF:
                    code = await stream.code()
                    problem = (
                        f"the stream ended ({code.name}: {await stream.details()}) after {answered} of {sent} answers"
                    )
                    fix = "answer every StepStream request, in order, until the client closes the stream"
                    break
                answered += 1
                try:
                    reply = decode_step(response, sent_request_id=request_id)
                except BadAnswer as exc:
                    problem, fix = str(exc), ANSWER_ROWS[field_of(str(exc))][1]
                    break
                verdicts = step_verdicts(reply, asked, space)
                if verdicts:
                    problem, fix = _first_problem(verdicts)
                    problem = f"answer {answered}: {problem}"
                    break
                ended += asked[ended_mask(reply, asked.size)].tolist()
            if problem:
                break
            if ended:
                await t.reset(ended, t.clips(len(ended)), t.seeds(len(ended)))
        if not problem:
            await stream.done_writing()
            extra = await stream.read()
            if extra is not grpc.aio.EOF:
                problem, fix = "an answer more than requests sent", "send exactly one StepResponse per StepRequest"
            elif (code := await stream.code()) != OK:
                problem, fix = f"the stream ended {code.name}", "end the stream OK when the client closes it"
    except grpc.aio.AioRpcError as exc:
        problem, fix = f"after {answered} of {sent} answers: {rpc_text(exc)}", f"implement StepStream, {DOCS}"
    finally:
        stream.cancel()
    rows.append(bad("stream", names[0], problem, fix) if problem else ok("stream", names[0], f"{sent} requests"))

    act = t.desc.action_space
    wrong = _misshapen(act)
    await t.reset([0], t.clips(1), [0])
    stream = t.stub.StepStream(timeout=t.timeout)
    try:
        await stream.write(pb.StepRequest(slot_ids=[0], actions=tensor.to_proto(wrong), request_id=1))
        code, details = await t.status_of(_stream_end(stream))
    finally:
        stream.cancel()
    serving = await t.serving()
    if code != Code.INVALID_ARGUMENT:
        rows.append(
            bad(
                "stream",
                names[1],
                f"a request with actions of shape {list(wrong.shape)}: the stream ended {code.name}",
                f"end the stream with the status a unary Step would answer (INVALID_ARGUMENT here), {DOCS}",
            )
        )
    elif serving:
        rows.append(bad("stream", names[1], serving, FIX_SERVING))
    else:
        rows.append(ok("stream", names[1], f"{code.name}: {shorten(details, 100)}"))
    return rows


# -- the local step socket ---------------------------------------------------------------------------------


async def check_local_step(t: Target, deterministic: bool) -> list[Result]:
    """The local step socket, when Describe names one and it opens from here: it answers as Step
    does (the same episode for the same actions), and refuses a connection without the run token."""
    names = (
        "local step socket: answers as Step does",
        "local step socket: a connection without the run token -> UNAUTHENTICATED",
    )
    path = t.capabilities.local_step_socket
    if not path:
        return [skip("local_step", name, "not advertised (Capabilities.local_step_socket is empty)") for name in names]
    fix = "serve StepStream's exchange on the socket as fast/frames.py frames it, " + DOCS + " (the local step socket)"
    try:
        stream = await LocalStepStream.open(path, t.credentials.token, max_message_bytes=MAX_MESSAGE_BYTES)
    except OSError as exc:
        why = f"it does not open from here ({type(exc).__name__}): a broker elsewhere steps over gRPC"
        return [skip("local_step", name, why) for name in names]
    except grpc.aio.AioRpcError as exc:
        return [bad("local_step", names[0], f"the run token was refused: {rpc_text(exc)}", fix)] + [
            skip("local_step", names[1], "the socket refused the right token")
        ]
    rows = []
    slot, clip, seed = t.slots[:1], t.clips(1), t.seeds(1)
    actions = [t.actions(1) for _ in range(5)]
    problem, over_socket = "", []
    try:
        await t.reset(slot, clip, seed)
        for a in actions:
            reply = await stream.step(slot, a)
            verdicts = step_verdicts(reply, slot, t.desc.observation_space)
            if verdicts:
                problem = _first_problem(verdicts)[0]
                break
            over_socket.append(reply)
            if ended_mask(reply, 1).any():
                break
    except grpc.aio.AioRpcError as exc:
        problem = f"after {len(over_socket)} steps: {rpc_text(exc)}"
    finally:
        await stream.close()
    if problem:
        rows.append(bad("local_step", names[0], problem, fix))
    elif not deterministic:
        rows.append(ok("local_step", names[0], f"{len(over_socket)} steps answered (not compared: not deterministic)"))
    else:
        await t.reset(slot, clip, seed)
        over_grpc = [await t.step(slot, a) for a in actions[: len(over_socket)]]
        same = all(a.observations.tobytes() == b.observations.tobytes() for a, b in zip(over_socket, over_grpc))
        rows.append(
            ok("local_step", names[0], f"{len(over_socket)} steps")
            if same
            else bad("local_step", names[0], "the observations differ from unary Step's for the same actions", fix)
        )
    try:
        refused = await LocalStepStream.open(path, "not-the-run-token", max_message_bytes=MAX_MESSAGE_BYTES)
        await refused.close()
        rows.append(
            bad("local_step", names[1], "a wrong token was accepted", "compare the HELLO frame with the run token")
        )
    except grpc.aio.AioRpcError as exc:
        good = exc.code() == Code.UNAUTHENTICATED
        rows.append(
            ok("local_step", names[1])
            if good
            else bad("local_step", names[1], rpc_text(exc), "answer a wrong token with UNAUTHENTICATED")
        )
    except OSError as exc:
        rows.append(bad("local_step", names[1], f"the connection failed: {exc}", "answer with an ERROR frame"))
    return rows


# -- figures -------------------------------------------------------------------------------------------------


async def check_prefetch(t: Target, deterministic: bool) -> list[Result]:
    """Prepare, when advertised: a Reset onto the prepared (clip, seed) starts the same episode as a
    plain Reset, a Reset onto another clip drops the preparation, an unknown clip is NOT_FOUND."""
    names = (
        "Prepare: a Reset onto the prepared clip starts the same episode as without Prepare",
        "Prepare: a Reset onto another clip is served as a plain Reset",
        "Prepare of a clip that does not exist: NOT_FOUND",
    )
    if not t.capabilities.prefetch:
        return [skip("prefetch", name, "not advertised (Capabilities.prefetch is false)") for name in names]
    slot, clips, seeds = t.slots[:1], t.clips(2), t.seeds(2)
    fix = "prepare the episode that Reset would start, and start it from the preparation, " + DOCS + " (Prepare)"

    async def prepare(clip: int, seed: int) -> None:
        request = pb.PrepareRequest(slot_ids=[int(slot[0])], clip_ids=[clip], seeds=[seed])
        await t.stub.Prepare(request, timeout=t.timeout)

    rows = []
    plain = [await t.reset(slot, clips[j : j + 1], seeds[j : j + 1]) for j in range(2)]
    await prepare(int(clips[0]), int(seeds[0]))
    used = await t.reset(slot, clips[:1], seeds[:1])
    await prepare(int(clips[0]), int(seeds[0]))
    other = await t.reset(slot, clips[1:], seeds[1:])
    for name, got, want in ((names[0], used, plain[0]), (names[1], other, plain[1])):
        if not deterministic:
            rows.append(skip("prefetch", name, "the server is not deterministic (determinism rows)"))
        elif got.observations.tobytes() == want.observations.tobytes():
            rows.append(ok("prefetch", name))
        else:
            rows.append(bad("prefetch", name, "the first observation differs from a plain Reset's", fix))
    try:
        await prepare(int(t.desc.num_clips), 0)
        rows.append(bad("prefetch", names[2], "answered OK", "refuse an unknown clip with NOT_FOUND, " + DOCS))
    except grpc.aio.AioRpcError as exc:
        good = exc.code() == Code.NOT_FOUND
        rows.append(
            ok("prefetch", names[2])
            if good
            else bad("prefetch", names[2], rpc_text(exc), "refuse an unknown clip with NOT_FOUND, " + DOCS)
        )
    return rows


def _figure(name: str, slots: int, durations: list[float], *, steps: bool) -> Figure:
    d = np.array(durations)
    total = float(d.sum()) or 1e-9
    return Figure(
        name=name,
        slots=slots,
        calls=d.size,
        median_ms=float(np.median(d) * 1e3),
        p95_ms=float(np.percentile(d, 95) * 1e3),
        calls_per_s=d.size / total,
        slot_steps_per_s=d.size * slots / total if steps else None,
    )


async def measure_figures(t: Target) -> tuple[list[Figure], list[Result]]:
    """Latency (median, p95) and throughput of Reset and Step for one slot and for all slots batched, and
    of StepStream for all slots when advertised; each measured for about `figure_budget_s` (untimed
    Resets of the slots that ended in between)."""
    n = t.num_slots
    budget = t.options.figure_budget_s
    figures, rows = [], []

    async def timed(call: Callable[[], Awaitable], max_calls: int, after=None) -> list[float]:
        durations: list[float] = []
        stop_at = time.monotonic() + budget
        while len(durations) < max_calls and (len(durations) < 3 or time.monotonic() < stop_at):
            started = time.perf_counter()
            reply = await call()
            durations.append(time.perf_counter() - started)
            if after is not None:
                await after(reply)
        return durations

    def resetter(asked: np.ndarray):
        async def after(reply) -> None:
            done = asked[ended_mask(reply, asked.size)]
            if done.size:
                await t.reset(done, t.clips(done.size), t.seeds(done.size))

        return after

    one, every = np.array([0]), t.slots
    plans = [
        ("Reset, 1 slot", 1, lambda: t.reset(one, t.clips(1), t.seeds(1)), 50, None, False),
        (f"Reset, all {n} slots", n, lambda: t.reset(every, t.clips(n), t.seeds(n)), 30, None, False),
        ("Step, 1 slot", 1, lambda: t.step(one, t.actions(1)), 500, resetter(one), True),
        (f"Step, all {n} slots", n, lambda: t.step(every, t.actions(n)), 500, resetter(every), True),
    ]
    for name, slots, call, max_calls, after, steps in plans:
        try:
            if steps:
                await t.reset(every, t.clips(n), t.seeds(n))
            figures.append(_figure(name, slots, await timed(call, max_calls, after), steps=steps))
        except (grpc.aio.AioRpcError, BadAnswer) as exc:
            detail = rpc_text(exc) if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            rows.append(bad("figures", f"measuring {name}", detail, f"answer every valid call, {DOCS}"))
    if t.capabilities.streaming_step:
        name = f"StepStream, all {n} slots"
        stream = t.stub.StepStream(timeout=max(t.timeout, budget * 3))
        try:
            await t.reset(every, t.clips(n), t.seeds(n))

            async def stream_step():
                await stream.write(pb.StepRequest(slot_ids=every.tolist(), actions=tensor.to_proto(t.actions(n))))
                response = await stream.read()
                if response is grpc.aio.EOF:
                    raise BadAnswer(f"the stream ended {(await stream.code()).name}")
                return decode_step(response)

            figures.append(_figure(name, n, await timed(stream_step, 500, resetter(every)), steps=True))
            await stream.done_writing()
        except (grpc.aio.AioRpcError, BadAnswer) as exc:
            detail = rpc_text(exc) if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            rows.append(bad("figures", f"measuring {name}", detail, f"answer every valid call, {DOCS}"))
        finally:
            stream.cancel()
    return figures, rows


# -- drain on SIGTERM ----------------------------------------------------------------------------------------


async def check_drain(t: Target) -> list[Result]:
    """With --pid: SIGTERM the server while a call is in flight; the call must complete, new calls be
    refused, and the process exit. Stops the server."""
    names = (
        "SIGTERM: the call in flight completes",
        "SIGTERM: new calls are refused",
        "SIGTERM: the process exits",
    )
    pid = t.options.pid
    if pid is None:
        return [skip("drain", name, "give --pid to check") for name in names]
    n = t.num_slots
    slots = t.slots
    rows = []
    await t.reset(slots, t.clips(n), t.seeds(n))
    fix_drain = (
        "on SIGTERM stop taking new calls but let the calls in flight finish (grpc server.stop(grace)), "
        "then exit 0 (fast/lifecycle.py run_until_signal)"
    )
    stream = None
    in_flight = ""
    if t.capabilities.streaming_step:
        # A stream that has answered once is surely in flight at the server when the signal comes.
        stream = t.stub.StepStream(timeout=t.timeout * 2)
        await stream.write(pb.StepRequest(slot_ids=slots.tolist(), actions=tensor.to_proto(t.actions(n)), request_id=1))
        first = await stream.read()
        live = slots if first is grpc.aio.EOF else slots[~ended_mask(decode_step(first, 1), n)]
        unary = None
    else:
        live = slots
        unary = asyncio.ensure_future(t.step_call(slots, t.actions(n)))
        await asyncio.sleep(0)
    signalled = time.monotonic()
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError as exc:
        if stream is not None:
            stream.cancel()
        raise UsageError(f"cannot signal process {pid}: {exc.strerror}") from None
    await asyncio.sleep(0.3)
    # A new call, while the call in flight has not finished yet.
    code, details = await t.status_of(t.stub.Describe(pb.DescribeRequest(), timeout=3.0))
    if code == OK:
        rows_new = bad(
            "drain",
            names[1],
            "Describe was answered 0.3 s after SIGTERM",
            "refuse new calls once SIGTERM came: " + fix_drain,
        )
    else:
        rows_new = ok("drain", names[1], f"Describe 0.3 s after SIGTERM: {code.name}")
    try:
        if stream is not None:
            answered = 0
            if live.size:
                for request_id in (2, 3):
                    await stream.write(
                        pb.StepRequest(
                            slot_ids=live.tolist(), actions=tensor.to_proto(t.actions(live.size)), request_id=request_id
                        )
                    )
                    response = await stream.read()
                    if response is grpc.aio.EOF:
                        break
                    answered += 1
                    live = live[~ended_mask(decode_step(response, request_id), live.size)]
                    if not live.size:
                        break
            await stream.done_writing()
            code, details = await t.status_of(_stream_end(stream))
            in_flight = (
                f"the StepStream open at SIGTERM answered {answered} more requests and ended {code.name}"
                if code == OK
                else ""
            )
            if code != OK:
                rows.append(bad("drain", names[0], f"the open StepStream ended {code.name}: {details}", fix_drain))
        else:
            code, details = await t.status_of(unary)
            if code == OK:
                in_flight = "the Step sent just before SIGTERM was answered"
            else:
                rows.append(bad("drain", names[0], f"the Step sent with the signal ended {code.name}", fix_drain))
    finally:
        if stream is not None:
            stream.cancel()
    if in_flight:
        rows.append(ok("drain", names[0], in_flight))
    rows.append(rows_new)
    give_up = signalled + t.options.drain_wait_s
    while process_alive(pid) and time.monotonic() < give_up:
        await asyncio.sleep(0.05)
    if process_alive(pid):
        rows.append(
            bad("drain", names[2], f"process {pid} still runs {t.options.drain_wait_s:g} s after SIGTERM", fix_drain)
        )
    else:
        rows.append(ok("drain", names[2], f"process {pid} exited {time.monotonic() - signalled:.1f} s after SIGTERM"))
    return rows


# -- the whole run ---------------------------------------------------------------------------------------------


async def _guarded(check: str, rows: list[Result], run: Callable[[], Awaitable]):
    """Run a check; a call that fails where the check expected an answer becomes a failed row."""
    try:
        return await run()
    except UsageError:
        raise
    except grpc.aio.AioRpcError as exc:
        rows.append(bad(check, f"{check}: a valid call", rpc_text(exc), f"answer every valid call, {DOCS}"))
    except BadAnswer as exc:
        rows.append(bad(check, f"{check}: answers decode", str(exc), ANSWER_ROWS[field_of(str(exc))][1]))
    except Exception as exc:  # noqa: BLE001 - a broken server must not crash the checker
        rows.append(bad(check, f"{check}: sim-check could finish", f"{type(exc).__name__}: {exc}", "see the detail"))
    return None


async def run_checks(address: str, credentials: Credentials, options: Options) -> Report:
    """Check the server at `address`; UsageError when it cannot be checked at all."""
    started = time.monotonic()
    report = Report(address)
    rows = report.results
    if options.pid is not None and not process_alive(options.pid):
        raise UsageError(f"--pid {options.pid}: no such process")
    t = Target(address, credentials, options)
    try:
        try:
            await t.client.wait_ready(options.connect_timeout_s)
        except asyncio.TimeoutError:
            raise UsageError(
                f"cannot reach {address}: nothing accepted a connection within {options.connect_timeout_s:g} s; "
                "is the simulator server running and listening on that address (HOST:PORT)?"
            ) from None
        rows += await check_health(t)
        rows += await check_describe(t)
        if t.desc is None:
            for check in ("reset", *AFTER_RESET):
                rows.append(skip(check, f"{check} checks", "Describe failed"))
            return report
        report.env_id = t.desc.env_id
        never_reset = await _guarded("errors", rows, lambda: probe_never_reset(t))
        reset_rows = await _guarded("reset", rows, lambda: check_reset(t)) or []
        rows += reset_rows
        if any(r.status == FAIL for r in rows if r.check == "reset"):
            for check in AFTER_RESET:
                rows.append(skip(check, f"{check} checks", "Reset failed"))
            return report
        deterministic = False
        determinism = await _guarded("determinism", rows, lambda: check_determinism(t))
        if determinism is not None:
            rows += determinism[0]
            deterministic = determinism[1]
        rows += await _guarded("batched", rows, lambda: check_batched(t)) or []
        rows += await _guarded("step", rows, lambda: check_step_semantics(t)) or []
        if never_reset is not None:
            rows.append(never_reset)
        rows += await _guarded("errors", rows, lambda: check_errors(t)) or []
        rows += await _guarded("errors", rows, lambda: check_refusals_change_nothing(t, deterministic)) or []
        rows += await _guarded("deadlines", rows, lambda: check_deadlines(t)) or []
        rows += await _guarded("stream", rows, lambda: check_stream(t)) or []
        rows += await _guarded("local_step", rows, lambda: check_local_step(t, deterministic)) or []
        rows += await _guarded("prefetch", rows, lambda: check_prefetch(t, deterministic)) or []
        measured = await _guarded("figures", rows, lambda: measure_figures(t))
        if measured is not None:
            report.figures, figure_rows = measured
            rows += figure_rows
        rows += await _guarded("drain", rows, lambda: check_drain(t)) or []
        return report
    finally:
        report.elapsed_s = time.monotonic() - started
        await t.close()

"""Observation and action spaces: the domain type and its wire form (fast.v1.Space).

A Space that decodes is a usable one: `space_from_proto` refuses (TensorError naming the field)
an unknown kind or dtype, a Box dimension below 1, bounds that are not exactly of the space's
shape and dtype (the wire form always carries them whole; no broadcasting of a scalar), NaN
bounds, low above high, and a Discrete n below 1. So a party that accepted a space can always
encode it again, and a space it could not use is never stored or passed on.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import numpy as np

from fast import tensor
from fast.quoting import quote
from fast.v1 import tensor_pb2 as pb


@dataclass(frozen=True)
class SpaceSpec:
    """An observation or action space, in the terms the proto API uses.

    kind "box": a float or int tensor of `shape` within [low, high] (arrays of `shape`).
    kind "discrete": a scalar int64 in [0, n).
    """

    kind: Literal["box", "discrete"]
    shape: tuple[int, ...]
    dtype: np.dtype
    low: np.ndarray | None = None
    high: np.ndarray | None = None
    n: int = 0

    @functools.cached_property
    def flat_bounds(self) -> tuple[np.ndarray, np.ndarray, bool]:
        """A Box's bounds flattened to its element count, and whether both are finite everywhere.

        Computed once (a space never changes; a server checks every Step's actions against them)."""
        low = np.broadcast_to(self.low, self.shape).reshape(-1)
        high = np.broadcast_to(self.high, self.shape).reshape(-1)
        return low, high, bool(np.isfinite(low).all() and np.isfinite(high).all())


def space_to_proto(space: SpaceSpec) -> pb.Space:
    if space.kind == "discrete":
        return pb.Space(kind=pb.SPACE_KIND_DISCRETE, dtype=pb.DTYPE_INT64, n=space.n)
    return pb.Space(
        kind=pb.SPACE_KIND_BOX,
        shape=space.shape,
        dtype=tensor.dtype_to_proto(space.dtype),
        low=tensor.to_proto(np.broadcast_to(space.low, space.shape).astype(space.dtype)),
        high=tensor.to_proto(np.broadcast_to(space.high, space.shape).astype(space.dtype)),
    )


def space_from_proto(space: pb.Space, *, field: str = "space") -> SpaceSpec:
    """Decode and check a space (see the module's docstring); TensorError names the field at fault."""
    if space.kind == pb.SPACE_KIND_DISCRETE:
        if space.n < 1:
            raise tensor.TensorError(f"{field}.n is {space.n}; a DISCRETE space needs n >= 1")
        return SpaceSpec("discrete", (), np.dtype(np.int64), n=int(space.n))
    if space.kind == pb.SPACE_KIND_BOX:
        result = SpaceSpec(
            "box",
            tensor.check_shape(space.shape, field=f"{field}.shape", minimum=1),
            tensor.dtype_from_proto(space.dtype, field=field),
            tensor.from_proto(space.low, field=f"{field}.low"),
            tensor.from_proto(space.high, field=f"{field}.high"),
        )
        _check_bounds(result, field)
        return result
    kind = pb.SpaceKind.Name(space.kind) if space.kind in pb.SpaceKind.values() else str(space.kind)
    raise tensor.TensorError(f"{field}.kind is {kind}; set BOX or DISCRETE")


def _check_bounds(space: SpaceSpec, field: str) -> None:
    for name, bound in (("low", space.low), ("high", space.high)):
        if bound.shape != space.shape or bound.dtype != space.dtype:
            raise tensor.TensorError(
                f"{field}.{name} is shape {quote(list(bound.shape))} of {bound.dtype.name}; it must be the space's "
                f"shape {quote(list(space.shape))} and dtype {space.dtype.name}, one bound per element"
            )
        if bound.dtype.kind == "f" and np.isnan(bound).any():
            raise tensor.TensorError(f"{field}.{name} holds NaN; use -inf or +inf for an unbounded element")
    above = np.flatnonzero(space.low.reshape(-1) > space.high.reshape(-1))
    if above.size:
        j = int(above[0])
        raise tensor.TensorError(
            f"{field}: low > high at element {j} ({space.low.reshape(-1)[j].item()} > "
            f"{space.high.reshape(-1)[j].item()}, {above.size} element(s) in all); every low must be <= its high"
        )


def describe_space(space: SpaceSpec) -> str:
    """A short human form for messages: Discrete(5), Box(shape=(62,), dtype=float32)."""
    if space.kind == "discrete":
        return f"Discrete({space.n})"
    return f"Box(shape={tuple(space.shape)}, dtype={np.dtype(space.dtype).name})"


def spaces_equal(a: SpaceSpec, b: SpaceSpec) -> bool:
    """The one compatibility rule of the project: kind, shape, dtype, n and bounds all equal.

    Every place that joins two parties (a simulator to a pool, a broker to the learner, a run
    to another run's checkpoint) applies this same rule, so one never accepts what another
    later refuses.
    """
    if (a.kind, tuple(a.shape), np.dtype(a.dtype), a.n) != (b.kind, tuple(b.shape), np.dtype(b.dtype), b.n):
        return False
    return all(
        (x is None and y is None) or (x is not None and y is not None and np.array_equal(x, y, equal_nan=True))
        for x, y in ((a.low, b.low), (a.high, b.high))
    )


def space_mismatch(name: str, ours: SpaceSpec, theirs: SpaceSpec) -> str:
    """ "" when the spaces agree (spaces_equal), else a sentence naming the difference."""
    if spaces_equal(ours, theirs):
        return ""
    ours_text, theirs_text = describe_space(ours), describe_space(theirs)
    if ours_text == theirs_text:  # same kind, shape and dtype: the bounds differ
        return f"{name} {theirs_text} has other bounds than {ours_text}"
    return f"{name} {theirs_text}, expected {ours_text}"


def random_actions(space: SpaceSpec, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` actions drawn uniformly from `space` (unbounded box dimensions from [-1, 1])."""
    if space.kind == "discrete":
        return rng.integers(0, space.n, size=count, dtype=np.int64)
    low = np.broadcast_to(space.low, space.shape)
    high = np.broadcast_to(space.high, space.shape)
    low, high = np.where(np.isfinite(low), low, -1.0), np.where(np.isfinite(high), high, 1.0)
    return rng.uniform(low, high, size=(count, *space.shape)).astype(space.dtype)

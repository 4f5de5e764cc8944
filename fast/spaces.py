"""Observation and action spaces: the domain type and its wire form (fast.v1.Space)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from fast import tensor
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
    if space.kind == pb.SPACE_KIND_DISCRETE:
        return SpaceSpec("discrete", (), np.dtype(np.int64), n=int(space.n))
    if space.kind == pb.SPACE_KIND_BOX:
        return SpaceSpec(
            "box",
            tuple(space.shape),
            tensor.dtype_from_proto(space.dtype, field=field),
            tensor.from_proto(space.low, field=f"{field}.low"),
            tensor.from_proto(space.high, field=f"{field}.high"),
        )
    raise tensor.TensorError(f"{field}.kind is {space.kind}; a server must send BOX or DISCRETE")

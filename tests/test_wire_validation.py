"""What a peer sends is checked where it is decoded: tensors (fast/tensor.py), spaces
(fast/spaces.py), and every message quotes input bounded (fast/quoting.py)."""

from __future__ import annotations

import numpy as np
import pytest

from fast import tensor
from fast.quoting import QUOTE_LIMIT, quote, shorten
from fast.spaces import SpaceSpec, space_from_proto, space_to_proto
from fast.v1 import tensor_pb2 as tpb

F32 = tpb.DTYPE_FLOAT32


def _tensor(shape, data: bytes = b"", dtype: int = F32) -> tpb.Tensor:
    return tpb.Tensor(dtype=dtype, shape=shape, data=data)


@pytest.mark.parametrize(
    "message, fragment",
    [
        (_tensor([2**62, 4]), "has an absurd dimension (4611686018427387904)"),  # 2**64 elements wrapped to 0
        (_tensor([2**31, 0]), "has an absurd dimension"),
        (_tensor([-1, 4]), "has a negative dimension (-1)"),
        (_tensor([0, 2**31 - 1, 2**31 - 1]), "is absurd: its dimensions multiply to more than"),  # numpy: "too big"
        (_tensor([1] * 33, b"\0" * 4), "has 33 dimensions; at most 32"),
        (_tensor([2, 2], b"\0" * 12), "shape [2, 2] of float32 needs 16 bytes, data has 12"),
        (_tensor([3], b"\0" * 12, dtype=99), "actions.dtype is 99"),
        (_tensor([3], b"\0" * 12, dtype=tpb.DTYPE_UNSPECIFIED), "actions.dtype is DTYPE_UNSPECIFIED"),
        (_tensor([3], b"\0\1\2", dtype=tpb.DTYPE_BOOL), "BOOL data holds bytes other than 0 and 1"),
    ],
)
def test_undecodable_tensors_are_refused_naming_the_field(message: tpb.Tensor, fragment: str) -> None:
    with pytest.raises(tensor.TensorError) as refused:
        tensor.from_proto(message, field="actions")
    assert fragment in str(refused.value) and str(refused.value).startswith("actions")


def test_a_zero_size_tensor_decodes_and_a_long_shape_is_quoted_bounded() -> None:
    assert tensor.from_proto(_tensor([0, 7]), field="x").shape == (0, 7)
    with pytest.raises(tensor.TensorError) as refused:
        tensor.from_proto(_tensor([2**40] * 32), field="x")
    assert len(str(refused.value)) < 250


BOX = SpaceSpec("box", (5,), np.dtype(np.float32), np.full(5, -1, np.float32), np.full(5, 1, np.float32))


def _box(**changes) -> tpb.Space:
    message = space_to_proto(BOX)
    for name, value in changes.items():
        if name in ("low", "high"):
            getattr(message, name).CopyFrom(value)
        elif name == "shape":
            del message.shape[:]
            message.shape.extend(value)
        else:
            setattr(message, name, value)
    return message


@pytest.mark.parametrize(
    "message, fragment",
    [
        (_box(low=tensor.to_proto(np.zeros(3, np.float32))), "observation_space.low is shape [3] of float32"),
        (_box(high=tensor.to_proto(np.zeros((5, 1), np.float32))), "observation_space.high is shape [5, 1]"),
        (_box(low=tensor.to_proto(np.zeros(5, np.float64))), "observation_space.low is shape [5] of float64"),
        (_box(low=tensor.to_proto(np.full(5, 2, np.float32))), "observation_space: low > high at element 0 (2.0 > 1.0"),
        (_box(high=tensor.to_proto(np.array([1, 1, np.nan, 1, 1], np.float32))), "observation_space.high holds NaN"),
        (_box(shape=[0]), "observation_space.shape [0] has a zero dimension"),
        (_box(shape=[-5]), "observation_space.shape [-5] has a negative dimension"),
        (_box(dtype=42), "observation_space.dtype is 42"),
        (_box(kind=0), "observation_space.kind is SPACE_KIND_UNSPECIFIED; set BOX or DISCRETE"),
        (_box(kind=9), "observation_space.kind is 9"),
        (tpb.Space(kind=tpb.SPACE_KIND_BOX, shape=[5], dtype=F32), "observation_space.low.dtype is DTYPE_UNSPECIFIED"),
        (tpb.Space(kind=tpb.SPACE_KIND_DISCRETE, n=0), "observation_space.n is 0"),
        (tpb.Space(kind=tpb.SPACE_KIND_DISCRETE, n=-3), "observation_space.n is -3"),
    ],
)
def test_unusable_spaces_are_refused_naming_the_field(message: tpb.Space, fragment: str) -> None:
    with pytest.raises(tensor.TensorError) as refused:
        space_from_proto(message, field="observation_space")
    assert fragment in str(refused.value)


def test_usable_spaces_decode_and_encode_again() -> None:
    unbounded = SpaceSpec(
        "box", (2, 3), np.dtype(np.float64), np.full((2, 3), -np.inf), np.array([[np.inf, 1, 2], [3, 3, 3]], float)
    )
    pixels = SpaceSpec(
        "box", (4, 4, 3), np.dtype(np.uint8), np.zeros((4, 4, 3), np.uint8), np.full((4, 4, 3), 255, np.uint8)
    )
    for space in (BOX, unbounded, pixels, SpaceSpec("discrete", (), np.dtype(np.int64), n=7)):
        back = space_from_proto(space_to_proto(space))
        assert space_to_proto(back) == space_to_proto(space)


def test_quote_bounds_any_input() -> None:
    assert quote("host:1") == "'host:1'" and quote([1, 2]) == "[1, 2]"
    long = quote("x" * 10_000)
    assert len(long) < QUOTE_LIMIT + 30 and long.startswith("'xxx") and "... (10002 characters)" in long
    assert quote("a\nb") == "'a\\nb'"  # control characters cannot forge log lines
    assert shorten("details") == "details" and len(shorten("d" * 1000, 300)) < 330

"""numpy <-> fast.v1.Tensor: raw little-endian bytes with a dtype and a shape.

Decoding validates what a peer sent and raises `TensorError` naming the field, so servers
answer INVALID_ARGUMENT instead of crashing: a known dtype; at most MAX_DIMS dimensions, none
negative or above MAX_DIM; an element count (computed exactly, so [2**62, 4] cannot wrap
around to 0) that matches the bytes; BOOL bytes that are 0 or 1.
"""

from __future__ import annotations

import math

import numpy as np

from fast.quoting import quote
from fast.v1 import tensor_pb2 as pb

# numpy's own limit on dimensions is 64; no FAST tensor needs more than a handful.
MAX_DIMS = 32
# One dimension at most this, and all of them (a zero counted as one) multiply to at most
# MAX_ELEMENTS: far above any real tensor (those are bounded by the message size), far below
# what numpy can shape, so a zero-size tensor cannot carry an absurd shape either.
MAX_DIM = (1 << 31) - 1
MAX_ELEMENTS = 1 << 32

_PROTO_TO_NUMPY: dict[int, np.dtype] = {
    pb.DTYPE_FLOAT32: np.dtype("<f4"),
    pb.DTYPE_FLOAT64: np.dtype("<f8"),
    pb.DTYPE_INT32: np.dtype("<i4"),
    pb.DTYPE_INT64: np.dtype("<i8"),
    pb.DTYPE_BOOL: np.dtype("?"),
    pb.DTYPE_UINT8: np.dtype("u1"),
}
_NUMPY_TO_PROTO: dict[np.dtype, int] = {dt.newbyteorder("="): code for code, dt in _PROTO_TO_NUMPY.items()}
_NATIVE: dict[int, np.dtype] = {code: dt.newbyteorder("=") for code, dt in _PROTO_TO_NUMPY.items()}


class TensorError(ValueError):
    """A Tensor message that cannot be decoded, or an array that cannot be encoded."""


def dtype_to_proto(dtype: np.dtype | type) -> int:
    dtype = np.dtype(dtype).newbyteorder("=")
    try:
        return _NUMPY_TO_PROTO[dtype]
    except KeyError:
        supported = ", ".join(str(d) for d in _NUMPY_TO_PROTO)
        raise TensorError(f"dtype {dtype} has no fast.v1 DType; use one of {supported}") from None


def dtype_from_proto(code: int, *, field: str = "tensor") -> np.dtype:
    try:
        return _PROTO_TO_NUMPY[code].newbyteorder("=")
    except KeyError:
        name = pb.DType.Name(code) if code in pb.DType.values() else str(code)
        raise TensorError(f"{field}.dtype is {name}; set one of FLOAT32, FLOAT64, INT32, INT64, BOOL, UINT8") from None


def to_proto(array: np.ndarray) -> pb.Tensor:
    array = np.asarray(array)
    code = _NUMPY_TO_PROTO.get(array.dtype)  # the usual case: a native dtype, one dict lookup
    if code is None:
        code = dtype_to_proto(array.dtype)  # another byte order of a known dtype, or a TensorError
    wire = _PROTO_TO_NUMPY[code]
    # tobytes() writes C order whatever the array's layout; a cast only where the bytes differ.
    data = (array if array.dtype == wire else array.astype(wire)).tobytes()
    return pb.Tensor(dtype=code, shape=array.shape, data=data)


def check_shape(shape, *, field: str, minimum: int = 0) -> tuple[int, ...]:
    """`shape` as a tuple once every dimension lies in [minimum, MAX_DIM], there are at most
    MAX_DIMS of them, and their product (zeros counted as ones) is at most MAX_ELEMENTS;
    TensorError naming `field` (and quoting the shape, bounded) otherwise."""
    if len(shape) > MAX_DIMS:
        raise TensorError(f"{field} has {len(shape)} dimensions; at most {MAX_DIMS} are supported")
    shape = tuple(map(int, shape))
    if shape and (min(shape) < minimum or max(shape) > MAX_DIM):
        bad = next(d for d in shape if not minimum <= d <= MAX_DIM)
        what = "a negative" if bad < 0 else ("a zero" if bad < minimum else "an absurd")
        raise TensorError(
            f"{field} {quote(list(shape))} has {what} dimension ({bad}); every dimension must lie in "
            f"[{minimum}, {MAX_DIM}]"
        )
    # Python ints: exact, never wrap around. A zero dimension counts as one here.
    if (math.prod(shape) or math.prod(d for d in shape if d)) > MAX_ELEMENTS:
        raise TensorError(
            f"{field} {quote(list(shape))} is absurd: its dimensions multiply to more than {MAX_ELEMENTS:,}"
        )
    return shape


def from_proto(tensor: pb.Tensor, *, field: str = "tensor") -> np.ndarray:
    """Decode to a native-order array (a copy, writable)."""
    wire = _PROTO_TO_NUMPY.get(tensor.dtype)
    if wire is None:
        dtype_from_proto(tensor.dtype, field=field)  # raises with the message
    shape = check_shape(tensor.shape, field=f"{field}.shape")
    count = math.prod(shape)  # a Python int: exact, never wraps around
    data = tensor.data
    if count * wire.itemsize != len(data):
        raise TensorError(
            f"{field}: shape {quote(list(shape))} of {wire.name} needs {count * wire.itemsize} bytes, "
            f"data has {len(data)}"
        )
    # numpy would keep bool bytes other than 0 and 1 as "true" values that compare unequal to
    # True; deleting the bytes 0 and 1 leaves nothing from good data (no array needed to tell).
    if wire.kind == "b" and data.translate(None, b"\x00\x01"):
        raise TensorError(f"{field}: BOOL data holds bytes other than 0 and 1")
    array = np.frombuffer(data, dtype=wire).reshape(shape)
    native = _NATIVE[tensor.dtype]
    return array.copy() if native == wire else array.astype(native)

"""numpy <-> fast.v1.Tensor: raw little-endian bytes with a dtype and a shape.

Decoding validates what a peer sent (known dtype, sizes that add up) and raises
`TensorError` naming the field, so servers can answer INVALID_ARGUMENT instead of crashing.
"""

from __future__ import annotations

import numpy as np

from fast.v1 import tensor_pb2 as pb

_PROTO_TO_NUMPY: dict[int, np.dtype] = {
    pb.DTYPE_FLOAT32: np.dtype("<f4"),
    pb.DTYPE_FLOAT64: np.dtype("<f8"),
    pb.DTYPE_INT32: np.dtype("<i4"),
    pb.DTYPE_INT64: np.dtype("<i8"),
    pb.DTYPE_BOOL: np.dtype("?"),
    pb.DTYPE_UINT8: np.dtype("u1"),
}
_NUMPY_TO_PROTO: dict[np.dtype, int] = {dt.newbyteorder("="): code for code, dt in _PROTO_TO_NUMPY.items()}


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
    code = dtype_to_proto(array.dtype)
    wire = _PROTO_TO_NUMPY[code]
    return pb.Tensor(dtype=code, shape=array.shape, data=np.ascontiguousarray(array, dtype=wire).tobytes())


def from_proto(tensor: pb.Tensor, *, field: str = "tensor") -> np.ndarray:
    """Decode to a native-order array (a copy, writable)."""
    wire = _PROTO_TO_NUMPY.get(tensor.dtype)
    if wire is None:
        dtype_from_proto(tensor.dtype, field=field)  # raises with the message
    shape = tuple(tensor.shape)
    if any(d < 0 for d in shape):
        raise TensorError(f"{field}.shape {list(shape)} has a negative dimension")
    count = int(np.prod(shape, dtype=np.int64))
    if count * wire.itemsize != len(tensor.data):
        raise TensorError(
            f"{field}: shape {list(shape)} of {wire.name} needs {count * wire.itemsize} bytes, "
            f"data has {len(tensor.data)}"
        )
    return np.frombuffer(tensor.data, dtype=wire).reshape(shape).astype(wire.newbyteorder("="), copy=True)

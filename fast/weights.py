"""A policy's weights payload read into numpy arrays, without torch.

The learner ships its policy as `torch.save` of a state_dict of plain CPU tensors
(learner/policy.py: `export_weights`). That file is a zip archive:

    <name>/data.pkl      a pickle of the dict: each tensor as `torch._utils._rebuild_tensor_v2(
                         storage, offset, size, stride, requires_grad, OrderedDict())`, each storage
                         a persistent id ('storage', torch.<Type>Storage, key, location, numel)
    <name>/data/<key>    one storage's raw elements
    <name>/byteorder     'little' or 'big' (absent in old files: little)
    <name>/version, <name>/.format_version, ...

`read_state_dict` parses that with a restricted unpickler: only the globals such a pickle names
are resolved, each to a function of this module that builds a numpy array (never to torch's own),
and anything else is refused before it runs, so foreign bytes execute no code. What comes back is
`{name: array}` equal, element for element, dtype and shape, to `torch.load(..., weights_only=True)`
(tests/test_weights.py). The broker reads its weights so and never imports torch (2.5 CPU seconds a
process) on a Box policy (broker/policy_runner.py).
"""

from __future__ import annotations

import io
import math
import pickle
import zipfile
from collections import OrderedDict
from typing import Any

import numpy as np

# Storage types as torch.save names them (`torch FloatStorage`), and their element types.
# BFloat16 and the quantised types have no numpy dtype: a payload using them is refused.
_STORAGE_DTYPES = {
    "DoubleStorage": "f8",
    "FloatStorage": "f4",
    "HalfStorage": "f2",
    "LongStorage": "i8",
    "IntStorage": "i4",
    "ShortStorage": "i2",
    "CharStorage": "i1",
    "ByteStorage": "u1",
    "BoolStorage": "?",
    "ComplexFloatStorage": "c8",
    "ComplexDoubleStorage": "c16",
}


class _StorageType:
    """What `torch <Type>Storage` resolves to: its element type, nothing callable."""

    __slots__ = ("dtype",)

    def __init__(self, code: str) -> None:
        self.dtype = np.dtype(code)


class _Storage:
    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array  # 1-d, read-only, in the payload's byte order


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple) or not all(type(v) is int for v in value):
        raise ValueError(f"tensor {what}: expected a tuple of ints, got {type(value).__name__}")
    return value


def _rebuild_tensor_v2(
    storage: Any,
    storage_offset: Any,
    size: Any,
    stride: Any,
    requires_grad: Any = False,
    backward_hooks: Any = None,
    metadata: Any = None,
) -> np.ndarray:
    """torch._utils._rebuild_tensor_v2 for numpy: the view (offset, size, stride) of the storage, copied."""
    if not isinstance(storage, _Storage):
        raise ValueError(f"tensor storage: expected a storage record, got {type(storage).__name__}")
    size, stride = _ints(size, "size"), _ints(stride, "stride")
    if type(storage_offset) is not int or storage_offset < 0:
        raise ValueError(f"tensor offset: expected an int >= 0, got {storage_offset!r}")
    if len(size) != len(stride) or any(n < 0 for n in size) or any(s < 0 for s in stride):
        raise ValueError(f"tensor view: size {size} and stride {stride} do not describe a view")
    if backward_hooks:  # an OrderedDict() in every tensor torch.save writes
        raise ValueError("tensor: backward hooks are not weights")
    if metadata is not None and metadata != {}:
        raise ValueError("tensor: metadata is not weights")
    source = storage.array
    count = math.prod(size)
    if count > len(source):  # only an overlapping view (stride 0) could: a forged one would allocate at will
        raise ValueError(f"tensor size {size}: more elements than its storage holds")
    if count and storage_offset + sum((n - 1) * s for n, s in zip(size, stride)) >= len(source):
        raise ValueError(f"tensor view: size {size}, stride {stride}, offset {storage_offset} overrun its storage")
    if count == 0:
        return np.zeros(size, dtype=source.dtype.newbyteorder("="))
    item = source.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(
        source[storage_offset:], shape=size, strides=tuple(s * item for s in stride), writeable=False
    )
    return np.array(view, dtype=source.dtype.newbyteorder("="), order="C")  # a copy, native byte order


def _rebuild_parameter(data: Any, requires_grad: Any = False, backward_hooks: Any = None) -> np.ndarray:
    if not isinstance(data, np.ndarray) or backward_hooks:
        raise ValueError("parameter: expected a tensor without hooks")
    return data


_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    **{("torch", name): _StorageType(code) for name, code in _STORAGE_DTYPES.items()},
}


class _Unpickler(pickle.Unpickler):
    def __init__(self, archive: zipfile.ZipFile, prefix: str, byteorder: str) -> None:
        super().__init__(io.BytesIO(archive.read(f"{prefix}data.pkl")))
        self._archive, self._prefix, self._byteorder = archive, prefix, byteorder
        self._storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a state_dict of tensors") from None

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unknown persistent record {type(pid).__name__}")
        _, kind, key, _location, numel = pid
        if not isinstance(kind, _StorageType) or not isinstance(key, str) or type(numel) is not int or numel < 0:
            raise pickle.UnpicklingError("malformed storage record")
        if key not in self._storages:
            dtype = kind.dtype.newbyteorder("<" if self._byteorder == "little" else ">")
            raw = self._archive.read(f"{self._prefix}data/{key}")
            if len(raw) != numel * dtype.itemsize:
                raise pickle.UnpicklingError(f"storage {key}: {len(raw)} bytes for {numel} elements of {dtype}")
            self._storages[key] = _Storage(np.frombuffer(raw, dtype=dtype))
        storage = self._storages[key]
        if storage.array.dtype.newbyteorder("=") != kind.dtype:
            raise pickle.UnpicklingError(f"storage {key}: read as two element types")
        return storage


def _read(data: bytes) -> dict[str, np.ndarray]:
    archive = zipfile.ZipFile(io.BytesIO(data))
    pickles = [name for name in archive.namelist() if name.endswith("/data.pkl") and name.count("/") == 1]
    if len(pickles) != 1:
        raise ValueError(f"expected one <name>/data.pkl in the archive, found {len(pickles)}")
    prefix = pickles[0][: -len("data.pkl")]
    names = set(archive.namelist())
    byteorder = archive.read(f"{prefix}byteorder").decode() if f"{prefix}byteorder" in names else "little"
    if byteorder not in ("little", "big"):
        raise ValueError(f"unknown byte order {byteorder[:20]!r}")
    state = _Unpickler(archive, prefix, byteorder).load()
    if not isinstance(state, dict):
        raise ValueError(f"expected a state_dict, got {type(state).__name__}")
    for name, value in state.items():
        if not isinstance(name, str) or not isinstance(value, np.ndarray):
            got = f"{type(name).__name__}: {type(value).__name__}"
            raise ValueError(f"expected a state_dict of named tensors, got {got}")
    return dict(state)


def read_state_dict(data: bytes, *, who: str = "import_weights") -> dict[str, np.ndarray]:
    """`{name: array}` from the bytes `torch.save` wrote of a state_dict of plain tensors.

    ValueError `<who>: not a weights payload (...)` for anything else (the message learner/policy.py's
    `import_weights` gives): corrupt bytes, another archive, a pickle naming any other global."""
    try:
        return _read(bytes(data))
    except Exception as error:  # zipfile, pickle and the checks above raise several types
        raise ValueError(f"{who}: not a weights payload ({type(error).__name__}: {error})") from error

"""fast/weights.py reads what torch.save writes exactly as torch.load does, and nothing else."""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fast.weights import read_state_dict
from learner.policy import ActionSpec, ActorCritic, export_weights


def _saved(state: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _assert_same(data: bytes) -> None:
    expected = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    got = read_state_dict(data)
    assert list(got) == list(expected)
    for name, tensor in expected.items():
        want = tensor.numpy()
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        assert np.array_equal(got[name], want, equal_nan=want.dtype.kind in "fc"), name
        assert got[name].tobytes() == want.tobytes(), name  # bit for bit: -0.0 and NaN payloads too


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["box", "discrete"])
@pytest.mark.parametrize("obs_norm", [False, True])
def test_policy_weights_read_as_torch_loads_them(dtype, kind, obs_norm) -> None:
    torch.manual_seed(3)
    spec = ActionSpec.box((2, 3)) if kind == "box" else ActionSpec.discrete(5)
    policy = ActorCritic((4, 2), spec, (16, 8), obs_norm=obs_norm).to(dtype)
    if obs_norm:
        policy.obs_normalizer.observe(torch.randn(7, 8, dtype=torch.float64))
    _assert_same(export_weights(policy))


def test_every_element_type_views_and_shared_storages() -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = {
        "count": torch.tensor(17, dtype=torch.int64),
        "steps": torch.tensor([1, -2, 3], dtype=torch.int32),
        "mask": torch.tensor([True, False]),
        "bytes": torch.tensor([0, 255], dtype=torch.uint8),
        "small": torch.tensor([-1, 2], dtype=torch.int8),
        "short": torch.tensor([-300, 2], dtype=torch.int16),
        "half": torch.tensor([0.5, -1.25], dtype=torch.float16),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 3),
        "whole": base,
        "transposed": base.t(),  # a stride that is not contiguous
        "row": base[2],  # an offset into the storage "whole" shares
        "column": base[:, 1],
        "nan": torch.tensor([float("nan"), float("inf"), -0.0]),
    }
    _assert_same(_saved(state))
    got = read_state_dict(_saved(state))
    assert got["transposed"].flags.c_contiguous and got["row"].flags.writeable
    assert not np.shares_memory(got["whole"], got["row"])


def test_a_pickle_naming_another_global_is_refused_unrun(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    good = export_weights(ActorCritic(3, ActionSpec.box(1), (4,)))
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(good)) as source, zipfile.ZipFile(out, "w") as target:
        for item in source.infolist():
            body = pickle.dumps({"w": Evil()}, protocol=2) if item.filename.endswith("data.pkl") else source.read(item)
            target.writestr(item, body)
    with pytest.raises(ValueError, match=r"import_weights: not a weights payload \(.*is not part of a state_dict"):
        read_state_dict(out.getvalue())
    assert not marker.exists()


@pytest.mark.parametrize(
    "data",
    [b"", b"not torch", np.random.default_rng(0).bytes(4096), _saved([torch.zeros(2)]), _saved({"x": 1.0})],
    ids=["empty", "text", "random", "a list", "a float"],
)
def test_foreign_bytes_are_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match=r"^import_weights: not a weights payload \("):
        read_state_dict(data)


def test_a_truncated_storage_is_refused() -> None:
    good = export_weights(ActorCritic(3, ActionSpec.box(1), (4,)))
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(good)) as source, zipfile.ZipFile(out, "w") as target:
        for item in source.infolist():
            body = source.read(item)
            target.writestr(item, body[:-4] if "/data/" in item.filename and len(body) > 4 else body)
    with pytest.raises(ValueError, match="bytes for"):
        read_state_dict(out.getvalue())

"""The tensor codec and the config resolver, on their own."""

from __future__ import annotations

import numpy as np
import pytest

from fast import tensor
from fast.config import ConfigError, resolve_config
from fast.v1 import tensor_pb2 as tpb
from sim_server.config import SimServerConfig


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.bool_, np.uint8])
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3, 5)])
def test_roundtrip_tensor(dtype, shape) -> None:
    array = (np.arange(int(np.prod(shape))).reshape(shape) % 3).astype(dtype)
    back = tensor.from_proto(tensor.to_proto(array))
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)
    back[...] = 0  # decoded arrays are writable copies


def test_encode_big_endian_as_little_endian() -> None:
    array = np.array([1.5, -2.0], dtype=">f8")
    message = tensor.to_proto(array)
    assert message.data == np.array([1.5, -2.0], "<f8").tobytes()


def test_encode_unsupported_dtype_names_it() -> None:
    with pytest.raises(tensor.TensorError, match="complex128 has no fast.v1 DType"):
        tensor.to_proto(np.zeros(2, np.complex128))


def test_decode_bad_size_names_field() -> None:
    with pytest.raises(tensor.TensorError, match=r"obs: shape \[2, 2\] of float32 needs 16 bytes, data has 4"):
        tensor.from_proto(tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=[2, 2], data=b"1234"), field="obs")
    with pytest.raises(tensor.TensorError, match="obs.dtype is DTYPE_UNSPECIFIED"):
        tensor.from_proto(tpb.Tensor(shape=[1]), field="obs")


def test_resolve_config_precedence(tmp_path) -> None:
    file = tmp_path / "sim.yaml"
    file.write_text("slots: 4\nport: 7000\ncost-preset: calibrated\n")
    cfg = resolve_config(
        SimServerConfig,
        file=file,
        env_prefix="FAST_SIM_",
        environ={"FAST_SIM_PORT": "7001", "FAST_SIM_SEED": "3"},
        overrides={"port": 7002, "slots": None},
    )
    assert (cfg.slots, cfg.port, cfg.seed, cfg.cost_preset) == (4, 7002, 3, "calibrated")


def test_resolve_config_errors_name_field_and_value(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"slots=0: Input should be greater than or equal to 1"):
        resolve_config(SimServerConfig, overrides={"slots": 0}, environ={})
    with pytest.raises(ConfigError, match=r"cost_preset='turbo'.*use one of off, calibrated, parallel, step-only"):
        resolve_config(SimServerConfig, env_prefix="FAST_SIM_", environ={"FAST_SIM_COST_PRESET": "turbo"})
    with pytest.raises(ConfigError, match="unknown setting\\(s\\) slotz"):
        (tmp_path / "bad.yaml").write_text("slotz: 3\n")
        resolve_config(SimServerConfig, file=tmp_path / "bad.yaml", environ={})
    with pytest.raises(ConfigError, match="env='carla'.*gym:<registered Gymnasium id>"):
        resolve_config(SimServerConfig, overrides={"env": "carla"}, environ={})

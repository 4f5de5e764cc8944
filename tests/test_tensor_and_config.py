"""The tensor codec and the config resolver, on their own."""

from __future__ import annotations

import numpy as np
import pytest

from fast import config as config_module
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
    with pytest.raises(ConfigError, match="env='carla'.*'gym:<Gymnasium id>'"):
        resolve_config(SimServerConfig, overrides={"env": "carla"}, environ={})


def test_an_unknown_variable_under_the_prefix_is_an_error_naming_the_closest_setting() -> None:
    with pytest.raises(
        ConfigError, match="FAST_SIM_SLOT names no setting under FAST_SIM_.*did you mean FAST_SIM_SLOTS"
    ):
        resolve_config(SimServerConfig, env_prefix="FAST_SIM_", environ={"FAST_SIM_SLOT": "3"})
    with pytest.raises(ConfigError, match="FAST_SIM_X names no setting.*the settings are .*SLOTS"):
        resolve_config(SimServerConfig, env_prefix="FAST_SIM_", environ={"FAST_SIM_X": "1"})
    # Without a prefix nothing is read from the environment, so nothing there is an error.
    assert resolve_config(SimServerConfig, environ={"FAST_SIM_X": "1"}).slots == 8
    # A misspelt key of a file or a flag gets the closest name too.
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) slotz \(did you mean slotz -> slots\?\)"):
        resolve_config(SimServerConfig, environ={}, overrides={"slotz": 3})


def test_variables_that_are_not_ours_pass(monkeypatch) -> None:
    environ = {
        # Kubernetes service links of a Service "fast-sim-server" (and "fast-sim")
        "FAST_SIM_SERVER_SERVICE_HOST": "10.0.0.3",
        "FAST_SIM_SERVER_SERVICE_PORT": "50051",
        "FAST_SIM_SERVER_SERVICE_PORT_GRPC": "50051",
        "FAST_SIM_SERVER_PORT": "tcp://10.0.0.3:50051",
        "FAST_SIM_SERVER_PORT_50051_TCP": "tcp://10.0.0.3:50051",
        "FAST_SIM_SERVER_PORT_50051_TCP_PROTO": "tcp",
        "FAST_SIM_SERVER_PORT_50051_TCP_ADDR": "10.0.0.3",
        "FAST_SIM_SERVICE_HOST": "10.0.0.4",
        # shared by every process
        "FAST_AUTH_TOKEN_FILE": "/run/token",
        "FAST_HOME": "/tmp/fast",
        "FAST_PARENT_PID": "1",
        "FAST_SIM_SLOTS": "3",
    }
    assert resolve_config(SimServerConfig, env_prefix="FAST_SIM_", environ=environ).slots == 3
    # A service-link-shaped name whose value is no link address is still a misspelt setting.
    with pytest.raises(ConfigError, match="FAST_SIM_SERVER_PORT names no setting"):
        resolve_config(SimServerConfig, env_prefix="FAST_SIM_", environ={"FAST_SIM_SERVER_PORT": "7000"})
    # A longer prefix of another process is that process's business, not an unknown setting of this one.
    monkeypatch.setattr(config_module, "ENV_PREFIXES", (*config_module.ENV_PREFIXES, "FAST_SIM_EXTRA_"))
    assert resolve_config(SimServerConfig, env_prefix="FAST_SIM_", environ={"FAST_SIM_EXTRA_SLOTS": "1"}).slots == 8


def test_every_prefix_in_use_is_known_and_none_holds_a_shared_variable() -> None:
    from broker.config import ENV_PREFIX as BROKER
    from fast import auth
    from fast.lifecycle import PARENT_ENV
    from gateway.settings import ENV_PREFIX as GATEWAY
    from jobs.train.config import ENV_PREFIX as TRAIN
    from learner.config import ENV_PREFIX as LEARNER
    from sim_server.config import ENV_PREFIX as SIM

    assert set(config_module.ENV_PREFIXES) == {SIM, LEARNER, BROKER, GATEWAY, TRAIN}
    for shared in (auth.TOKEN_ENV, auth.TOKEN_FILE_ENV, auth.HOME_ENV, PARENT_ENV):
        assert not shared.startswith(config_module.ENV_PREFIXES), shared

"""Each setting declared once (fast/settings.py): the CLI options, their defaults and help, the FAST_*
variables, the YAML keys and a launcher's argv all come from the models, and agree with them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from pydantic import BaseModel, TypeAdapter
from typer.testing import CliRunner

import jobs.cli as cli
from broker.config import ENV_PREFIX as BROKER_PREFIX
from broker.config import BrokerConfig
from fast.config import resolve_config
from fast.settings import cli_default, flag_name, parse_cli_value, same_as
from gateway.settings import ENV_PREFIX as GATEWAY_PREFIX
from gateway.settings import GatewaySettings
from jobs.train.config import ENV_PREFIX as TRAIN_PREFIX
from jobs.train.config import TrainConfig
from learner.config import ENV_PREFIX as LEARNER_PREFIX
from learner.config import LearnerConfig
from learner.ppo_config import PPOConfig
from sim_server.config import ENV_PREFIX as SIM_PREFIX
from sim_server.config import SimServerConfig

COMMANDS = {
    "sim-server": (SimServerConfig, SIM_PREFIX),
    "learner": (LearnerConfig, LEARNER_PREFIX),
    "broker": (BrokerConfig, BROKER_PREFIX),
    "gateway": (GatewaySettings, GATEWAY_PREFIX),
    "train": (TrainConfig, TRAIN_PREFIX),
}
# What a config needs before it validates (the broker and the gateway need their upstreams).
REQUIRED: dict[str, dict[str, Any]] = {
    "broker": {"simulators": ["127.0.0.1:1"], "learner": "127.0.0.1:2"},
    "gateway": {"broker": "127.0.0.1:1", "learner": "127.0.0.1:2"},
    "train": {"name": "run"},
}
TLS = {"tls_cert": Path("/c.pem"), "tls_key": Path("/k.pem"), "tls_ca": Path("/ca.pem"), "tls_server_name": "fast"}
# A value other than the default for every setting of every model: each is given the three ways below.
SAMPLES: dict[str, dict[str, Any]] = {
    "sim-server": {
        "env": "gym:Pendulum-v1",
        "slots": 3,
        "processes": 2,
        "host": "0.0.0.0",
        "port": 7001,
        "seed": 7,
        "num_clips": 50,
        "env_kwargs": {"g": 9.81, "name": "a b", "flag": "true", "sizes": [1, 2]},
        "cost_preset": "step-only",
        "step_latency_s": 0.0016,
        "reset_fixed_s": 0.25,
        "map_load_s": 0.1,
        "map_load_cached_s": 0.0,
        "prefetch_step_penalty": 0.3,
        "max_message_bytes": 2048,
        "grace_s": 1.5,
        "step_stream": False,
        "batched_reset": False,
        "prefetch": False,
        "local_step": False,
        "local_step_dir": "/tmp/steps",
        **TLS,
    },
    "learner": {
        "host": "0.0.0.0",
        "port": 7002,
        "max_message_bytes": 4096,
        "grace_s": 2.5,
        "checkpoint_dir": Path("/tmp/ckpt"),
        "checkpoint_every": 5,
        "keep_checkpoints": 7,
        "device": "cuda:1",
        "hidden_sizes": [32, 16, 8],
        "init_log_std": 0.25,
        "obs_norm": True,
        "anneal_lr_updates": 100,
        "world_size": 4,
        "rank": 3,
        "master_addr": "10.0.0.9",
        "master_port": 29400,
        "rank_timeout_s": 120.0,
        "gamma": 0.995,
        "gae_lambda": 0.9,
        "clip_eps": 0.1,
        "vf_coef": 0.25,
        "ent_coef": 0.01,
        "lr": 1e-3,
        "update_epochs": 4,
        "num_minibatches": 32,
        "max_grad_norm": float("inf"),
        "norm_adv": False,
        "clip_vloss": True,
        "norm_reward": True,
        "seed": 11,
        **TLS,
    },
    "broker": {
        "simulators": ["10.0.0.1:50051", "dns:///sim:50051"],
        "shard": "1/3",
        "learner": "10.0.0.2:50052",
        "host": "0.0.0.0",
        "port": 7003,
        "mode": "sgr",
        "mode_candidates": ["ver", "sgr"],
        "mode_probe_every": 4,
        "mode_margin": 0.25,
        "alpha": 0.75,
        "alpha_min": 0.2,
        "alpha_max": 0.9,
        "t_max": 120,
        "truncation": "reset",
        "samples_per_iteration": 512,
        "iterations": 9,
        "first_iteration": 4,
        "seed": 3,
        "holdout_every": 5,
        "locality": True,
        "locality_max_repeat": 2,
        "prefetch": True,
        "pipeline": True,
        "local_step": False,
        "step_timeout_s": 1.5,
        "reset_timeout_s": 12.0,
        "describe_timeout_s": 2.0,
        "stall_timeout_s": 30.0,
        "max_bad_answers": 2,
        "startup_timeout_s": 20.0,
        "learner_wait_s": 45.0,
        "update_timeout_s": 100.0,
        "run_dir": "/tmp/run",
        **TLS,
    },
    "gateway": {
        "host": "0.0.0.0",
        "port": 0,
        "broker": ["10.0.0.1:1", "10.0.0.3:3"],
        "learner": ["10.0.0.2:2", "10.0.0.4:4"],
        "deadline_s": 2.5,
        "export_deadline_s": 60.0,
        "cors_origins": ["https://a.example", "http://b.example:8080"],
        "max_body_bytes": 4096,
        **TLS,
    },
    "train": {
        "name": "sample-run",
        "runs_dir": Path("/tmp/runs"),
        "mode": "auto",
        "mode_candidates": ["autoreset", "fast"],
        "mode_probe_every": 3,
        "mode_margin": 0.05,
        "alpha": "auto",
        "alpha_min": 0.3,
        "alpha_max": 0.7,
        "truncation": "reset",
        "t_max": 50,
        "samples_per_iteration": 256,
        "locality": True,
        "locality_max_repeat": 3,
        "prefetch": True,
        "pipeline": True,
        "local_step": False,
        "iterations": 12,
        "seed": 4,
        "simulators": [],
        "env": "gym:Pendulum-v1",
        "servers": 3,
        "slots": 6,
        "cost_preset": "calibrated",
        "lr": 5e-4,
        "update_epochs": 3,
        "num_minibatches": 4,
        "ent_coef": 0.02,
        "gamma": 0.9,
        "norm_reward": True,
        "init_log_std": -1.0,
        "anneal_lr": True,
        "obs_norm": True,
        "checkpoint_every": 2,
        "keep_checkpoints": 9,
        "ranks": 2,
        "max_restarts": 1,
        "gateway": False,
        "gateway_port": 8081,
        "eval_episodes_per_clip": 0,
        "startup_timeout_s": 30.0,
        "stop_timeout_s": 10.0,
    },
}


@pytest.fixture
def clean_environment(monkeypatch) -> None:
    """No FAST_* setting of the developer's shell leaks into what a command resolves."""
    import os

    for name in list(os.environ):
        if name.startswith(("FAST_SIM_", "FAST_LEARNER_", "FAST_BROKER_", "FAST_GATEWAY_", "FAST_TRAIN_")):
            monkeypatch.delenv(name)


@pytest.fixture
def resolved(monkeypatch, clean_environment) -> list[BaseModel]:
    """What each command resolves, caught before anything is served or trained."""
    caught: list[BaseModel] = []

    def serve(model, env_prefix, serve, config, overrides):
        caught.append(resolve_config(model, file=config, env_prefix=env_prefix, overrides=overrides))
        return 0

    def train(cfg):
        caught.append(cfg)
        return 0

    monkeypatch.setattr(cli, "_serve", serve)
    monkeypatch.setattr("jobs.train.orchestrate.train", train)
    return caught


def _invoke(command: str, argv: list[str]) -> None:
    result = CliRunner().invoke(cli.app, [command, *argv])
    assert result.exit_code == 0, f"{argv}: {result.output} {result.exception!r}"


def _options(command: str) -> dict[str, Any]:
    group = typer.main.get_command(cli.app)
    return {param.name: param for param in group.commands[command].params}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_setting_has_one_option_with_the_models_default_and_help(command: str) -> None:
    model, _ = COMMANDS[command]
    params = _options(command)
    assert set(params) == {*model.model_fields, "config"}
    for name, field in model.model_fields.items():
        param = params[name]
        assert flag_name(name, field) in param.opts, name
        assert field.description, f"{model.__name__}.{name} has no description (its --help line)"
        assert param.default == cli_default(field), name
        # The default the option shows, read back as the model reads it, is the model's own.
        shown = parse_cli_value(name, field, param.default)
        if shown is not None:
            assert TypeAdapter(field.annotation).validate_python(shown) == model.model_fields[name].get_default(
                call_default_factory=True
            ), name


@pytest.mark.parametrize("command", COMMANDS)
def test_without_flags_a_command_resolves_the_models_defaults(command: str, resolved) -> None:
    model, _ = COMMANDS[command]
    required = REQUIRED.get(command, {})
    argv = model(**required).to_argv(fields=required)
    _invoke(command, argv)
    assert resolved[0] == model(**required)


def test_help_shows_the_models_defaults_and_ranges() -> None:
    wide = {"COLUMNS": "400"}  # one line per option
    out = CliRunner().invoke(cli.app, ["learner", "--help"], env=wide).output
    # The minibatches the learner uses, not CleanRL's 32 that the help once claimed.
    line = next(line for line in out.splitlines() if "--num-minibatches" in line)
    assert "Minibatches per epoch. [x>=1]" in line and "[default: 8]" in line, line
    out = CliRunner().invoke(cli.app, ["broker", "--help"], env=wide).output
    line = next(line for line in out.splitlines() if "--alpha " in line)
    assert "auto: chosen each iteration" in line and "[default: 0.5]" in line, line
    line = next(line for line in out.splitlines() if "--alpha-min" in line)
    assert "[0<x<=1]" in line and "[default: 0.1]" in line, line
    assert "sc | autoreset | sgr | ver | fast" in out and "carry | reset" in out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_setting_can_be_given_three_ways(command: str, resolved, tmp_path: Path) -> None:
    """The same sample value as a flag (to_argv), a FAST_* variable and a YAML key resolves to the same config."""
    model, prefix = COMMANDS[command]
    sample = SAMPLES[command]
    assert set(sample) == set(model.model_fields), "give every setting a sample value"
    expected = model(**sample)
    _invoke(command, expected.to_argv())  # flags
    # As YAML writes them (inf is .inf, which JSON has not); paths as strings.
    values = {name: str(v) if isinstance(v, Path) else v for name, v in expected.model_dump().items()}
    environ = {
        f"{prefix}{name.upper()}": yaml.safe_dump(value).strip().removesuffix("\n...") for name, value in values.items()
    }
    from_env = resolve_config(model, env_prefix=prefix, environ=environ)
    file = tmp_path / "settings.yaml"
    file.write_text(yaml.safe_dump(values))
    from_file = resolve_config(model, file=file, environ={})
    assert resolved[0] == expected
    assert from_env == expected
    assert from_file == expected


@pytest.mark.parametrize("command", COMMANDS)
def test_to_argv_round_trips(command: str, resolved) -> None:
    """model -> argv -> parsed model: the same config, whether every setting is written or only those set."""
    model, _ = COMMANDS[command]
    configs = [model(**SAMPLES[command]), model(**REQUIRED.get(command, {}))]
    for cfg in configs:
        _invoke(command, cfg.to_argv())
        _invoke(command, cfg.to_argv(fields=model.model_fields))
    assert resolved == [configs[0], configs[0], configs[1], configs[1]]


def test_to_argv_writes_only_the_settings_given() -> None:
    cfg = SimServerConfig(env="takeover", slots=3, port=0, step_stream=False)
    assert cfg.to_argv() == ["--env", "takeover", "--slots", "3", "--port", "0", "--no-step-stream"]
    kwargs = SimServerConfig(env_kwargs={"g": 9.81, "name": "x"}).to_argv()
    assert kwargs == ["--env-kwarg", "g=9.81", "--env-kwarg", "name=x"]


def test_the_old_flags_still_work(resolved) -> None:
    """Flags of manifests, docs and tests: --no-step-stream, --env-kwarg, a comma-separated --simulators."""
    _invoke("sim-server", ["--no-step-stream", "--no-prefetch", "--env-kwarg", "g=9.81", "--slots", "2"])
    _invoke("broker", ["--simulators", "a:1,b:2", "--learner", "c:3", "--mode", "sgr"])
    sim, broker = resolved
    assert (sim.step_stream, sim.prefetch, sim.batched_reset, sim.env_kwargs, sim.slots) == (
        False,
        False,
        True,
        {"g": 9.81},
        2,
    )
    assert (broker.simulators, broker.learner, broker.mode) == (["a:1", "b:2"], "c:3", "sgr")


def test_a_flag_beats_the_environment_and_an_option_left_out_does_not(resolved, monkeypatch) -> None:
    monkeypatch.setenv("FAST_SIM_SLOTS", "6")
    monkeypatch.setenv("FAST_SIM_PREFETCH", "false")
    _invoke("sim-server", [])
    _invoke("sim-server", ["--slots", "3", "--prefetch"])
    assert (resolved[0].slots, resolved[0].prefetch) == (6, False)
    assert (resolved[1].slots, resolved[1].prefetch) == (3, True)


def test_bad_option_values_exit_2_naming_the_setting(resolved) -> None:
    result = CliRunner().invoke(cli.app, ["sim-server", "--env-kwarg", "novalue"])
    assert result.exit_code == 2 and "KEY=VALUE" in result.output


def test_train_takes_the_services_settings_whole() -> None:
    """alpha's type, range, default and help are the broker's; the learner's PPO knobs the learner's."""
    for name in (
        "mode",
        "mode_candidates",
        "mode_probe_every",
        "mode_margin",
        "alpha",
        "alpha_min",
        "alpha_max",
        "t_max",
        "truncation",
        "samples_per_iteration",
        "locality",
        "prefetch",
    ):
        ours, theirs = TrainConfig.model_fields[name], BrokerConfig.model_fields[name]
        assert (ours.default, ours.description, ours.metadata) == (theirs.default, theirs.description, theirs.metadata)
    for name in ("lr", "num_minibatches", "gamma", "ent_coef", "init_log_std", "checkpoint_every"):
        ours, theirs = TrainConfig.model_fields[name], LearnerConfig.model_fields[name]
        assert (ours.default, ours.metadata) == (theirs.default, theirs.metadata)
    assert TrainConfig.model_fields["slots"].default == 5 and SimServerConfig.model_fields["slots"].default == 8
    with pytest.raises(ValueError, match="alpha"):
        TrainConfig(alpha=1.5)
    copied = same_as(BrokerConfig, "alpha", default=0.25)
    assert copied.default == 0.25 and copied.description == BrokerConfig.model_fields["alpha"].description


def test_learner_defaults_are_ppo_configs() -> None:
    ppo = PPOConfig()
    for name in PPOConfig.__dataclass_fields__:
        assert LearnerConfig.model_fields[name].default == getattr(ppo, name), name


def test_a_run_starts_its_services_from_configs(tmp_path: Path) -> None:
    """What `fast train` hands each service: its own settings under the same names, as flags."""
    cfg = TrainConfig(**{k: v for k, v in SAMPLES["train"].items() if k != "simulators"})
    sim = cfg.sim_server_config()
    assert (sim.env, sim.slots, sim.cost_preset, sim.port) == ("gym:Pendulum-v1", 6, "calibrated", 0)
    learner = cfg.learner_config(tmp_path)
    assert learner.checkpoint_dir == tmp_path / "checkpoints" and learner.anneal_lr_updates == cfg.iterations
    for name in ("lr", "update_epochs", "num_minibatches", "gamma", "ent_coef", "norm_reward", "init_log_std"):
        assert getattr(learner, name) == getattr(cfg, name), name
    assert learner.seed == cfg.seed
    broker = cfg.broker_config(["127.0.0.1:1"], "127.0.0.1:2", tmp_path, 10)
    for name in (
        "mode",
        "mode_candidates",
        "mode_probe_every",
        "mode_margin",
        "alpha",
        "alpha_min",
        "alpha_max",
        "t_max",
        "truncation",
        "locality",
        "prefetch",
        "pipeline",
        "local_step",
    ):
        assert getattr(broker, name) == getattr(cfg, name), name
    assert (broker.iterations, broker.holdout_every, broker.run_dir) == (cfg.iterations, 10, str(tmp_path))
    gateway = cfg.gateway_config(["127.0.0.1:3"], ["127.0.0.1:2"])
    assert gateway.port == cfg.gateway_port and "--port" in gateway.to_argv()
    argv = cfg.gateway_config(["127.0.0.1:3", "127.0.0.1:4"], ["127.0.0.1:2", "127.0.0.1:5"]).to_argv()
    assert "--broker 127.0.0.1:3,127.0.0.1:4 --learner 127.0.0.1:2,127.0.0.1:5" in " ".join(argv)


def test_gateway_takes_one_broker_as_before_or_several(resolved, tmp_path: Path) -> None:
    """--broker HOST:PORT, FAST_GATEWAY_BROKER=HOST:PORT and `broker: HOST:PORT` as before; several comma-separated."""
    _invoke("gateway", ["--broker", "a:1", "--learner", "b:2"])
    _invoke("gateway", ["--broker", "a:1,c:3", "--learner", "b:2, d:4"])
    assert (resolved[0].broker, resolved[0].learner) == (["a:1"], ["b:2"])
    assert (resolved[1].broker, resolved[1].learner) == (["a:1", "c:3"], ["b:2", "d:4"])
    environ = {"FAST_GATEWAY_BROKER": "a:1", "FAST_GATEWAY_LEARNER": "b:2"}
    from_env = resolve_config(GatewaySettings, env_prefix=GATEWAY_PREFIX, environ=environ)
    assert (from_env.broker, from_env.learner) == (["a:1"], ["b:2"])
    file = tmp_path / "gateway.yaml"
    file.write_text("broker: a:1,c:3\nlearner: [b:2, d:4]\n")
    from_file = resolve_config(GatewaySettings, file=file, environ={})
    assert (from_file.broker, from_file.learner) == (["a:1", "c:3"], ["b:2", "d:4"])
    with pytest.raises(ValueError, match="listed twice; give each broker once"):
        GatewaySettings(broker="a:1,a:1", learner="b:2")
    with pytest.raises(ValueError, match="learner is empty"):
        GatewaySettings(broker="a:1", learner=" , ")


# `fast bench` options named otherwise than their config's field.
BENCH_FIELDS = {"preset": "presets", "truncation": "truncations", "prefetch_step_penalty": "prefetch_step_penalties"}


@pytest.mark.parametrize("command", ["sampling", "train"])
def test_bench_options_default_to_their_configs(command: str) -> None:
    """`fast bench sampling`'s --locality, --prefetch and --prefetch-step-penalty once had defaults of their own."""
    import dataclasses

    from jobs.bench.config import SamplingBenchConfig, TrainBenchConfig

    config = {"sampling": SamplingBenchConfig, "train": TrainBenchConfig}[command]
    fields = {f.name: f.default for f in dataclasses.fields(config)}
    group = typer.main.get_command(cli.app).commands["bench"]
    params = {param.name: param for param in group.commands[command].params}
    compared = 0
    for name, param in params.items():
        field = BENCH_FIELDS.get(name, name)
        if field not in fields:
            continue
        expected, shown = fields[field], param.default
        if shown is None:  # unset: the config decides, and the help says what it does
            assert expected in ((), None) or f"unset: {expected:g}" in param.help, name
            continue
        if isinstance(expected, tuple):
            cast = type(expected[0])
            parts = [part.strip() for part in shown.split(",")]
            shown = tuple(part == "on" if cast is bool else cast(part) for part in parts)
        assert shown == expected, f"--{name.replace('_', '-')}: {shown!r} != {config.__name__}.{field} {expected!r}"
        compared += 1
    assert compared >= {"sampling": 19, "train": 7}[command]

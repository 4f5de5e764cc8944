"""`fast`: one command-line entry point, a subcommand per service and per job."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
import yaml
from pydantic import BaseModel

from broker.samplers import MODE_NAMES
from fast.config import ConfigError, resolve_config
from fast.lifecycle import exit_with_parent

app = typer.Typer(
    help="FAST: aligned sampling and training for parallel on-policy RL.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ConfigFile = Annotated[
    Optional[Path], typer.Option("--config", help="YAML file of settings (flags and env vars override it).")
]
# Where a simulator server or the learner listens (the broker's port and host are its control API's).
ServicePort = Annotated[Optional[int], typer.Option(help="Port; 0 picks a free one and prints it. \\[default: 0]")]
ServiceHost = Annotated[Optional[str], typer.Option(help="Address to bind. \\[default: 127.0.0.1]")]


def _parse_kwargs(pairs: list[str] | None) -> dict[str, Any] | None:
    if not pairs:
        return None
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--env-kwarg")
        out[key] = yaml.safe_load(value)
    return out


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def _serve(
    model: type[BaseModel],
    env_prefix: str,
    serve: Callable[[Any], Awaitable[Any]],
    config: Path | None,
    overrides: dict[str, Any],
) -> Any:
    """Run a service: its settings resolved (defaults < --config < environment < flags), served until it stops.

    Returns what `serve` returns; a bad setting or a port that cannot be bound exits 2 with the message.
    """
    exit_with_parent()  # started by a FAST job: stop with it, even if it was SIGKILLed
    try:
        cfg = resolve_config(model, file=config, env_prefix=env_prefix, overrides=overrides)
        return asyncio.run(serve(cfg))
    except (ConfigError, ValueError, OSError) as exc:
        _fail(str(exc))


@app.command("sim-server")
def sim_server(
    env: Annotated[
        Optional[str],
        typer.Option(
            help="'takeover', 'gym:<Gymnasium id>', 'gym:<module>:<env factory>' or 'slot:<module>:<SlotEnv factory>'. "
            "\\[default: takeover]"
        ),
    ] = None,
    slots: Annotated[Optional[int], typer.Option(help="Number of slots. \\[default: 8]")] = None,
    processes: Annotated[
        Optional[int],
        typer.Option(
            min=1,
            help="Spread the slots over N worker processes, each stepping its engines in its main thread "
            "(one engine per process when N = slots). \\[default: none: the server process steps them]",
        ),
    ] = None,
    port: ServicePort = None,
    host: ServiceHost = None,
    seed: Annotated[Optional[int], typer.Option(help="Catalog seed. \\[default: 0]")] = None,
    num_clips: Annotated[Optional[int], typer.Option(help="Catalog size. \\[default: 200 takeover, 1000 gym]")] = None,
    cost_preset: Annotated[
        Optional[str], typer.Option(help="off | calibrated | parallel | step-only | vectorized. \\[default: off]")
    ] = None,
    step_latency_s: Annotated[Optional[float], typer.Option(help="Override the preset's step latency.")] = None,
    reset_fixed_s: Annotated[Optional[float], typer.Option(help="Override the preset's fixed reset cost.")] = None,
    map_load_s: Annotated[Optional[float], typer.Option(help="Override the preset's map load cost.")] = None,
    map_load_cached_s: Annotated[
        Optional[float], typer.Option(help="Override the preset's cached map load cost.")
    ] = None,
    prefetch_step_penalty: Annotated[
        Optional[float],
        typer.Option(help="Fraction added to the step latency while a Prepare's background load runs. \\[default: 0]"),
    ] = None,
    env_kwarg: Annotated[Optional[list[str]], typer.Option(help="KEY=VALUE passed to gym.make (repeatable).")] = None,
    max_message_bytes: Annotated[
        Optional[int], typer.Option(help="Largest message accepted. \\[default: 64 MiB]")
    ] = None,
    grace_s: Annotated[Optional[float], typer.Option(help="Drain time on SIGTERM. \\[default: 5]")] = None,
    no_step_stream: Annotated[
        bool, typer.Option("--no-step-stream", help="Emulate a server without StepStream (advertised false, refused).")
    ] = False,
    no_batched_reset: Annotated[
        bool,
        typer.Option(
            "--no-batched-reset", help="Emulate a server that resets one slot per call (advertised, several refused)."
        ),
    ] = False,
    no_prefetch: Annotated[
        bool, typer.Option("--no-prefetch", help="Emulate a server without Prepare (advertised false, refused).")
    ] = False,
    no_local_step: Annotated[
        bool,
        typer.Option(
            "--no-local-step",
            help="Serve Step over gRPC only, without the Unix socket a broker on this machine may step over.",
        ),
    ] = False,
    local_step_dir: Annotated[
        Optional[str],
        typer.Option(
            help="Where the local step socket's private directory is made. \\[default: the system's temp dir]"
        ),
    ] = None,
    config: ConfigFile = None,
) -> None:
    """Serve a simulator (the built-in takeover workload or a Gymnasium env) over gRPC.

    Settings also come from FAST_SIM_<NAME> environment variables (e.g. FAST_SIM_SLOTS=16).
    """
    from sim_server.config import ENV_PREFIX, SimServerConfig
    from sim_server.server import serve

    overrides = dict(
        env=env,
        slots=slots,
        processes=processes,
        port=port,
        host=host,
        seed=seed,
        num_clips=num_clips,
        cost_preset=cost_preset,
        step_latency_s=step_latency_s,
        reset_fixed_s=reset_fixed_s,
        map_load_s=map_load_s,
        map_load_cached_s=map_load_cached_s,
        prefetch_step_penalty=prefetch_step_penalty,
        env_kwargs=_parse_kwargs(env_kwarg),
        max_message_bytes=max_message_bytes,
        grace_s=grace_s,
        step_stream=False if no_step_stream else None,
        batched_reset=False if no_batched_reset else None,
        prefetch=False if no_prefetch else None,
        local_step=False if no_local_step else None,
        local_step_dir=local_step_dir,
    )
    _serve(SimServerConfig, ENV_PREFIX, serve, config, overrides)


@app.command("learner")
def learner(
    port: ServicePort = None,
    host: ServiceHost = None,
    checkpoint_dir: Annotated[
        Optional[Path],
        typer.Option(help="Where checkpoints are written and resumed from. \\[default: runs/learner/checkpoints]"),
    ] = None,
    checkpoint_every: Annotated[
        Optional[int], typer.Option(help="Checkpoint every K policy versions. \\[default: 10]")
    ] = None,
    keep_checkpoints: Annotated[Optional[int], typer.Option(help="Newest checkpoints kept. \\[default: 3]")] = None,
    device: Annotated[
        Optional[str], typer.Option(help="cpu | cuda | cuda:<index>. \\[default: CUDA when present, else CPU]")
    ] = None,
    seed: Annotated[
        Optional[int], typer.Option(help="Seeds the initial weights and the minibatch shuffling. \\[default: 1]")
    ] = None,
    lr: Annotated[Optional[float], typer.Option(help="Adam learning rate. \\[default: 3e-4]")] = None,
    update_epochs: Annotated[Optional[int], typer.Option(help="PPO epochs per batch. \\[default: 10]")] = None,
    num_minibatches: Annotated[Optional[int], typer.Option(help="Minibatches per epoch. \\[default: 32]")] = None,
    max_message_bytes: Annotated[
        Optional[int], typer.Option(help="Largest message accepted. \\[default: 256 MiB]")
    ] = None,
    grace_s: Annotated[
        Optional[float], typer.Option(help="Drain time on SIGTERM before the final checkpoint. \\[default: 10]")
    ] = None,
    config: ConfigFile = None,
) -> None:
    """Serve the learner (SMPO-PPO, policy versions, checkpoints) over gRPC.

    Every setting, PPO hyper-parameters included, also comes from FAST_LEARNER_<NAME>
    environment variables (e.g. FAST_LEARNER_GAMMA=0.995) or the --config file; see docs/learner.md.
    """
    from learner.config import ENV_PREFIX, LearnerConfig
    from learner.server import serve

    overrides = dict(
        port=port,
        host=host,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        keep_checkpoints=keep_checkpoints,
        device=device,
        seed=seed,
        lr=lr,
        update_epochs=update_epochs,
        num_minibatches=num_minibatches,
        max_message_bytes=max_message_bytes,
        grace_s=grace_s,
    )
    _serve(LearnerConfig, ENV_PREFIX, serve, config, overrides)


@app.command("broker")
def broker(
    simulators: Annotated[
        Optional[str], typer.Option(help="Simulator servers: HOST:PORT[,HOST:PORT...] or dns:///NAME:PORT.")
    ] = None,
    learner: Annotated[Optional[str], typer.Option("--learner", help="Learner HOST:PORT.")] = None,
    mode: Annotated[Optional[str], typer.Option(help="sc | autoreset | sgr | ver | fast. \\[default: fast]")] = None,
    alpha: Annotated[Optional[float], typer.Option(help="DPSA termination-rate threshold. \\[default: 0.5]")] = None,
    t_max: Annotated[Optional[int], typer.Option(help="DPSA round length limit. \\[default: 200]")] = None,
    truncation: Annotated[
        Optional[str],
        typer.Option(help="DPSA at a round's end: carry live episodes on, or reset them. \\[default: carry]"),
    ] = None,
    samples_per_iteration: Annotated[
        Optional[int], typer.Option(help="Valid transitions per iteration. \\[default: 2048]")
    ] = None,
    iterations: Annotated[Optional[int], typer.Option(help="Iterations; 0 runs until stopped. \\[default: 0]")] = None,
    seed: Annotated[
        Optional[int], typer.Option(help="Seed of clip dealing and action sampling. \\[default: 0]")
    ] = None,
    run_dir: Annotated[Optional[str], typer.Option(help="Directory for metrics.jsonl.")] = None,
    port: Annotated[Optional[int], typer.Option(help="Port of the control API; 0 picks one. \\[default: 0]")] = None,
    host: Annotated[Optional[str], typer.Option(help="Address of the control API. \\[default: 127.0.0.1]")] = None,
    step_timeout_s: Annotated[Optional[float], typer.Option(help="Deadline of a Step call. \\[default: 5]")] = None,
    learner_wait_s: Annotated[
        Optional[float], typer.Option(help="How long to wait for an unavailable learner. \\[default: 120]")
    ] = None,
    config: ConfigFile = None,
) -> None:
    """Run the rollout broker: sample with DPSA (or a baseline mode) and train through the learner.

    Settings also come from FAST_BROKER_<NAME> environment variables or the --config file.
    Exits 0 when its iterations are done, 1 when the run failed.
    """
    from broker.config import ENV_PREFIX, BrokerConfig
    from broker.server import serve

    overrides = dict(
        simulators=simulators,
        learner=learner,
        mode=mode,
        alpha=alpha,
        t_max=t_max,
        truncation=truncation,
        samples_per_iteration=samples_per_iteration,
        iterations=iterations,
        seed=seed,
        run_dir=run_dir,
        port=port,
        host=host,
        step_timeout_s=step_timeout_s,
        learner_wait_s=learner_wait_s,
    )
    raise typer.Exit(code=_serve(BrokerConfig, ENV_PREFIX, serve, config, overrides))


@app.command("gateway")
def gateway(
    broker: Annotated[Optional[str], typer.Option("--broker", help="Broker control API HOST:PORT.")] = None,
    learner: Annotated[Optional[str], typer.Option("--learner", help="Learner HOST:PORT.")] = None,
    port: Annotated[
        Optional[int], typer.Option(help="HTTP port; 0 picks a free one and prints it. \\[default: 8080]")
    ] = None,
    host: ServiceHost = None,
    deadline_s: Annotated[Optional[float], typer.Option(help="Deadline of every upstream call. \\[default: 5]")] = None,
    cors_origins: Annotated[
        Optional[str], typer.Option(help="Origins allowed by CORS, comma-separated. \\[default: none, CORS closed]")
    ] = None,
    config: ConfigFile = None,
) -> None:
    """Serve the REST gateway: status and control of a run, Prometheus /metrics and a dashboard at /.

    Mutating calls need the run's token (FAST_AUTH_TOKEN or FAST_AUTH_TOKEN_FILE, as the services);
    settings also come from FAST_GATEWAY_<NAME> environment variables or the --config file; see docs/gateway.md.
    """
    from gateway.server import serve
    from gateway.settings import ENV_PREFIX, GatewaySettings

    overrides = dict(
        broker=broker, learner=learner, port=port, host=host, deadline_s=deadline_s, cors_origins=cors_origins
    )
    _serve(GatewaySettings, ENV_PREFIX, serve, config, overrides)


def _train_default(field: str) -> str:
    # Shown in --help from TrainConfig itself, so the defaults live in one place (jobs/train/config.py).
    from jobs.train.config import TrainConfig

    # The backslash keeps rich (typer's help renderer) from reading "\\[default: ...]" as markup and dropping it.
    return f" \\[default: {TrainConfig.model_fields[field].default}]"


@app.command("train")
def train(
    mode: Annotated[
        Optional[str], typer.Option(help="sc | autoreset | sgr | ver | fast." + _train_default("mode"))
    ] = None,
    alpha: Annotated[
        Optional[float], typer.Option(help="DPSA termination-rate threshold." + _train_default("alpha"))
    ] = None,
    t_max: Annotated[Optional[int], typer.Option(help="DPSA round length limit." + _train_default("t_max"))] = None,
    truncation: Annotated[
        Optional[str],
        typer.Option(
            help="DPSA at a round's end: carry live episodes on, or reset them. carry | reset."
            + _train_default("truncation")
        ),
    ] = None,
    simulators: Annotated[
        Optional[str],
        typer.Option(
            help="Train on simulator servers that run already: HOST:PORT[,HOST:PORT...] or dns:///NAME:PORT "
            "(none started or stopped; the environment's run token; --env/--servers/--slots/--cost-preset then "
            "do not apply)."
        ),
    ] = None,
    servers: Annotated[
        Optional[int], typer.Option(help="Simulator server processes." + _train_default("servers"))
    ] = None,
    slots: Annotated[Optional[int], typer.Option(help="Slots per simulator server." + _train_default("slots"))] = None,
    seed: Annotated[
        Optional[int],
        typer.Option(help="Seed of dealing, sampling, initial weights and evaluation." + _train_default("seed")),
    ] = None,
    iterations: Annotated[
        Optional[int], typer.Option(help="Training iterations." + _train_default("iterations"))
    ] = None,
    samples_per_iteration: Annotated[
        Optional[int], typer.Option(help="Valid transitions per iteration." + _train_default("samples_per_iteration"))
    ] = None,
    cost_preset: Annotated[
        Optional[str],
        typer.Option(
            help="Simulator cost model: off | calibrated | parallel | step-only | vectorized."
            + _train_default("cost_preset")
        ),
    ] = None,
    env: Annotated[
        Optional[str], typer.Option(help="'takeover' or 'gym:<Gymnasium id>'." + _train_default("env"))
    ] = None,
    lr: Annotated[Optional[float], typer.Option(help="Adam learning rate." + _train_default("lr"))] = None,
    update_epochs: Annotated[
        Optional[int], typer.Option(help="PPO epochs per iteration." + _train_default("update_epochs"))
    ] = None,
    eval_episodes_per_clip: Annotated[
        Optional[int],
        typer.Option(
            help="Evaluation episodes per held-out clip; 0 skips it." + _train_default("eval_episodes_per_clip")
        ),
    ] = None,
    checkpoint_every: Annotated[
        Optional[int], typer.Option(help="Checkpoint every K policy versions." + _train_default("checkpoint_every"))
    ] = None,
    keep_checkpoints: Annotated[
        Optional[int], typer.Option(help="Newest checkpoints kept." + _train_default("keep_checkpoints"))
    ] = None,
    name: Annotated[
        Optional[str], typer.Option(help="Run name, the directory under --runs-dir. \\[default: <mode>-<timestamp>]")
    ] = None,
    runs_dir: Annotated[
        Optional[Path], typer.Option(help="Where runs are written." + _train_default("runs_dir"))
    ] = None,
    gateway_port: Annotated[
        Optional[int],
        typer.Option(help="Port of the REST gateway and dashboard; 0 picks one." + _train_default("gateway_port")),
    ] = None,
    config: ConfigFile = None,
) -> None:
    """Train on the local stack: K simulator servers, learner and broker as processes; then evaluate and report.

    Writes runs/<name>/ (config.yaml, metrics.jsonl, tb/, checkpoints/, eval.json, report.md, plots).
    Settings also come from FAST_TRAIN_<NAME> environment variables or the --config file; see docs/train.md.
    Exits 0 when done, 1 when the run failed, 128+N when stopped by signal N.
    """
    from jobs.train.config import ENV_PREFIX, TrainConfig
    from jobs.train.orchestrate import TrainError
    from jobs.train.orchestrate import train as run_training

    overrides = dict(
        mode=mode,
        alpha=alpha,
        t_max=t_max,
        truncation=truncation,
        simulators=simulators,
        servers=servers,
        slots=slots,
        seed=seed,
        iterations=iterations,
        samples_per_iteration=samples_per_iteration,
        cost_preset=cost_preset,
        env=env,
        lr=lr,
        update_epochs=update_epochs,
        eval_episodes_per_clip=eval_episodes_per_clip,
        checkpoint_every=checkpoint_every,
        keep_checkpoints=keep_checkpoints,
        name=name,
        runs_dir=runs_dir,
        gateway_port=gateway_port,
    )
    try:
        cfg = resolve_config(TrainConfig, file=config, env_prefix=ENV_PREFIX, overrides=overrides)
        code = run_training(cfg)
    except (ConfigError, TrainError, OSError) as exc:
        _fail(str(exc))
    raise typer.Exit(code=code)


@app.command("report")
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory, e.g. runs/fast-20260101-120000.")],
) -> None:
    """(Re)write RUN_DIR/report.md and its plots from the run's metrics.jsonl, eval.json and config.yaml."""
    from jobs.train.report import ReportError, write_report

    try:
        path = write_report(run_dir)
    except ReportError as exc:
        _fail(str(exc))
    typer.echo(f"wrote {path}")


bench_app = typer.Typer(help="Benchmarks measured side by side in one run (docs/bench.md).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


def _on_off(value: str, option: str) -> tuple[bool, ...]:
    words = _csv(value, str, option)
    if not words or any(w not in ("off", "on") for w in words):
        raise typer.BadParameter(f"{value[:40]!r}: give off, on or off,on", param_hint=option)
    return tuple(dict.fromkeys(w == "on" for w in words))


def _csv(value: str, cast, option: str) -> tuple:
    try:
        return tuple(cast(part.strip()) for part in value.split(",") if part.strip())
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a comma-separated list", param_hint=option) from None


@bench_app.command("sampling")
def bench_sampling(
    modes: Annotated[str, typer.Option(help="Sampling modes, comma-separated.")] = ",".join(MODE_NAMES),
    clips: Annotated[str, typer.Option(help="Clip counts (parallel slots), comma-separated.")] = "5,10,20,30",
    preset: Annotated[
        Optional[str],
        typer.Option(
            help="Cost presets, comma-separated (docs/cost_model.md). \\[default: calibrated,parallel,vectorized]"
        ),
    ] = None,
    servers: Annotated[Optional[int], typer.Option(min=1, help="Simulator server processes. \\[default: 2]")] = None,
    simulators: Annotated[
        Optional[str],
        typer.Option(
            help="Measure simulator servers that run already: HOST:PORT[,HOST:PORT...] or dns:///NAME:PORT "
            "(their own costs; none started or stopped; the environment's run token; --preset/--servers/--env/"
            "--gym-reference then do not apply)."
        ),
    ] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Interleaved repeats; medians are reported.")] = 3,
    samples: Annotated[int, typer.Option(min=1, help="Valid transitions per measured iteration.")] = 2048,
    alpha: Annotated[float, typer.Option(help="FAST termination-rate threshold.")] = 0.5,
    t_max: Annotated[int, typer.Option(help="FAST round length limit.")] = 200,
    truncation: Annotated[
        str,
        typer.Option(
            help="FAST at a round's end: carry live episodes on, reset them, or carry,reset for both "
            "(rows fast+carry, fast+reset)."
        ),
    ] = "carry,reset",
    seed: Annotated[int, typer.Option(help="Seed of clip dealing, actions and the random policy.")] = 0,
    checkpoint_dir: Annotated[
        Optional[Path], typer.Option(help="A fast train run's checkpoints/: adds the trained policy.")
    ] = None,
    gym_reference: Annotated[
        Optional[bool],
        typer.Option(
            help="Also measure Gymnasium's AsyncVectorEnv with autoreset (takeover only). "
            "\\[default: on, off with --simulators]"
        ),
    ] = None,
    env: Annotated[
        Optional[str],
        typer.Option(
            help="Workload: takeover, or gym:<id> such as gym:highway_env:highway-fast-v0. \\[default: takeover]"
        ),
    ] = None,
    ver_per_slot: Annotated[
        bool, typer.Option(help="Also measure VER stepping one slot per Step call (rows ver+perslot), as it was.")
    ] = False,
    locality: Annotated[
        str,
        typer.Option(
            help="Clip dealing with map locality: off, on, or off,on for both (rows MODE+locality; docs/bench.md)."
        ),
    ] = "off,on",
    locality_max_repeat: Annotated[
        int, typer.Option(min=1, help="Locality's diversity knob: clips of one map a server gets in a row.")
    ] = 8,
    prefetch: Annotated[
        str,
        typer.Option(
            help="Load slots' next clips while they step (fast.v1 Prepare): off, on, or off,on for both "
            "(rows MODE+prefetch)."
        ),
    ] = "off,on",
    prefetch_step_penalty: Annotated[
        Optional[str],
        typer.Option(
            help="Fractions of the step latency added while a background load runs, comma-separated; each "
            "value gets servers of its own (rows PRESET+penalty<value>; only presets with step and load costs). "
            "\\[default: 0,0.25; 0 with --simulators]"
        ),
    ] = None,
    length_samples: Annotated[
        int,
        typer.Option(min=0, help="Steady-state episode lengths: valid transitions counted per configuration; 0 skips."),
    ] = 6000,
    warmup_steps: Annotated[
        int,
        typer.Option(
            min=0, help="Warm-up steps per slot before each measured iteration (at least 256 samples in all)."
        ),
    ] = 200,
    length_warmup_steps: Annotated[
        int, typer.Option(min=0, help="Steady-state episode lengths: warm-up steps per slot before counting.")
    ] = 600,
    out: Annotated[
        Optional[Path], typer.Option(help="Output directory. \\[default: runs/bench-sampling-<timestamp>]")
    ] = None,
) -> None:
    """Every sampling mode at every clip count and cost preset, interleaved: JSON, a markdown table, PNG charts."""
    import time as _time

    from jobs.bench.harness import EXTERNAL, SamplingBenchConfig
    from jobs.bench.sampling import run
    from jobs.external import inapplicable

    try:
        if simulators:
            given = {"--preset": preset, "--servers": servers, "--env": env, "--gym-reference": gym_reference}
            if any(value is not None for value in given.values()):
                raise ValueError(inapplicable(flag for flag, value in given.items() if value is not None))
        cfg = SamplingBenchConfig(
            modes=_csv(modes, str, "--modes"),
            clips=_csv(clips, int, "--clips"),
            presets=(EXTERNAL,) if simulators else _csv(preset or "calibrated,parallel,vectorized", str, "--preset"),
            servers=servers or 2,
            simulators=_csv(simulators or "", str, "--simulators"),
            repeats=repeats,
            samples=samples,
            alpha=alpha,
            t_max=t_max,
            truncations=_csv(truncation, str, "--truncation"),
            seed=seed,
            checkpoint_dir=checkpoint_dir,
            gym_reference=not simulators if gym_reference is None else gym_reference,
            env=env or "takeover",
            length_samples=length_samples,
            warmup_steps=warmup_steps,
            length_warmup_steps=length_warmup_steps,
            locality=_on_off(locality, "--locality"),
            ver_per_slot=ver_per_slot,
            prefetch=_on_off(prefetch, "--prefetch"),
            prefetch_step_penalties=_csv(
                prefetch_step_penalty or ("0" if simulators else "0,0.25"), float, "--prefetch-step-penalty"
            ),
            locality_max_repeat=locality_max_repeat,
        )
        out_dir = out or Path("runs") / f"bench-sampling-{_time.strftime('%Y%m%d-%H%M%S')}"
        run(cfg, out_dir)
    except (ValueError, OSError, RuntimeError) as exc:
        _fail(str(exc))
    typer.echo(f"results: {out_dir / 'sampling.md'}")


# The help text is passed explicitly (not as a docstring) so that it stays one line in `fast bench --help`.
@bench_app.command(
    "train",
    help="Held-out return against wall-clock per mode and seed (one fast train each); "
    "time to a target return, PNG curves.",
)
def bench_train(
    modes: Annotated[
        str,
        typer.Option(
            help="Sampling modes, comma-separated; a mode may add +locality and/or +prefetch (e.g. fast+locality)."
        ),
    ] = "sc,sgr,ver,fast",
    clips: Annotated[
        Optional[int], typer.Option(min=1, help="Parallel clips (slots) of every run. \\[default: 10]")
    ] = None,
    seeds: Annotated[int, typer.Option(min=1, help="Seeds per mode.")] = 3,
    servers: Annotated[
        Optional[int], typer.Option(min=1, help="Simulator server processes per run. \\[default: 2]")
    ] = None,
    preset: Annotated[
        Optional[str], typer.Option(help="Cost preset (docs/cost_model.md). \\[default: calibrated]")
    ] = None,
    simulators: Annotated[
        Optional[str],
        typer.Option(
            help="Train and evaluate on simulator servers that run already: HOST:PORT[,HOST:PORT...] or "
            "dns:///NAME:PORT (none started or stopped; the environment's run token; --clips/--servers/--preset "
            "then do not apply)."
        ),
    ] = None,
    iterations: Annotated[int, typer.Option(min=1, help="Iterations per run.")] = 150,
    samples_per_iteration: Annotated[int, typer.Option(min=1, help="Valid transitions per iteration.")] = 2048,
    update_epochs: Annotated[int, typer.Option(min=1, help="PPO epochs per iteration.")] = 10,
    checkpoint_every: Annotated[
        int, typer.Option(min=1, help="Evaluate every K-th policy version on held-out clips.")
    ] = 10,
    eval_episodes_per_clip: Annotated[
        int, typer.Option(min=1, help="Held-out episodes per clip at each evaluated version.")
    ] = 2,
    target_return: Annotated[
        Optional[float],
        typer.Option(
            help="Held-out return whose wall-clock is reported (80 for a new benchmark; with --report-only, "
            "recomputed for this target, or the stored one when not given)."
        ),
    ] = None,
    out: Annotated[
        Optional[Path], typer.Option(help="Output directory. \\[default: runs/bench-train-<timestamp>]")
    ] = None,
    report_only: Annotated[
        bool, typer.Option(help="Train nothing: recompute the summary and rewrite the report of --out's train.json.")
    ] = False,
    resume: Annotated[
        bool,
        typer.Option(
            help="Go on with the stopped benchmark in --out: keep the runs its train.json holds (the same options "
            "are needed) and run the rest."
        ),
    ] = False,
) -> None:
    import time as _time

    from jobs.bench.train import TrainBenchConfig, rewrite_report, run

    if report_only:
        if out is None:
            _fail("--report-only needs --out, the directory of a finished benchmark")
        try:
            rewrite_report(out, target_return)
        except (ValueError, OSError) as exc:
            _fail(str(exc))
        typer.echo(f"results: {out / 'train.md'}")
        return
    if resume and out is None:
        _fail("--resume needs --out, the directory of the stopped benchmark")
    try:
        cfg = TrainBenchConfig(
            modes=_csv(modes, str, "--modes"),
            clips=clips,
            seeds=seeds,
            servers=servers,
            preset=preset,
            iterations=iterations,
            samples_per_iteration=samples_per_iteration,
            update_epochs=update_epochs,
            checkpoint_every=checkpoint_every,
            eval_episodes_per_clip=eval_episodes_per_clip,
            simulators=_csv(simulators or "", str, "--simulators"),
            **({} if target_return is None else {"target_return": target_return}),
        )
        out_dir = out or Path("runs") / f"bench-train-{_time.strftime('%Y%m%d-%H%M%S')}"
        run(cfg, out_dir, resume=resume)
    except (ValueError, OSError, RuntimeError) as exc:
        _fail(str(exc))
    typer.echo(f"results: {out_dir / 'train.md'}")


def _register_compare() -> None:
    from jobs.compare.cli import compare_command

    app.command("compare")(compare_command)


_register_compare()


@app.command("play")
def play(
    env: Annotated[str, typer.Option(help="'takeover' or 'gym:<Gymnasium id>'.")] = "takeover",
    slots: Annotated[int, typer.Option(min=1, help="Slots of the server it starts.")] = 8,
    steps: Annotated[int, typer.Option(min=1, help="Lock-step steps to play.")] = 300,
    address: Annotated[
        Optional[str], typer.Option(help="Play against a running server instead of starting one.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random policy and the clip order.")] = 0,
) -> None:
    """Start a simulator server, drive it over gRPC with a random policy, print episode metrics."""
    import grpc

    from jobs.play import play as run_play

    try:
        asyncio.run(run_play(env=env, slots=slots, steps=steps, address=address, seed=seed))
    except grpc.RpcError as exc:  # e.g. UNAUTHENTICATED: the server has another token (docs/security.md)
        _fail(f"{address}: {exc.code().name}: {exc.details()}")
    except (ValueError, OSError, TimeoutError) as exc:
        _fail(str(exc))


@app.command("sim-check")
def sim_check(
    address: Annotated[str, typer.Argument(help="HOST:PORT of the simulator server to check.")],
    token_file: Annotated[
        Optional[Path],
        typer.Option(help="File holding the server's run token. \\[default: the environment's, docs/security.md]"),
    ] = None,
    json_path: Annotated[
        Optional[Path], typer.Option("--json", help="Also write the results to this JSON file.")
    ] = None,
    pid: Annotated[
        Optional[int], typer.Option(help="The server's process id: check its drain on SIGTERM (this stops it).")
    ] = None,
    steps: Annotated[int, typer.Option(min=1, help="Lock-step steps of every slot in the step checks.")] = 300,
    timeout_s: Annotated[float, typer.Option(min=0.1, help="Deadline of every call.")] = 10.0,
    seed: Annotated[int, typer.Option(help="Seed of the random actions, clips and episode seeds.")] = 0,
) -> None:
    """Check that a simulator server keeps the fast.v1 contract: a pass/fail table with fixes, latency figures.

    Exits 0 when no check failed, 1 when one did, 2 when the server cannot be checked (docs/sim_check.md).
    """
    from jobs.sim_check import Options, main

    options = Options(timeout_s=timeout_s, steps=steps, seed=seed, pid=pid)
    raise typer.Exit(code=main(address, options, token_file=token_file, json_path=json_path))


def _http_health(url: str, timeout_s: float, tls_ca: Optional[Path]) -> None:
    """`fast health URL`: GET it; exit 0 on a 2xx answer, 1 otherwise. One plain argument, so that a
    container health check needs no shell and no quoting (podman's Docker API splits a health check's
    arguments at spaces: `python -c "import ..."` reaches the container as `python -c import`)."""
    import ssl
    import urllib.error
    import urllib.request

    context = ssl.create_default_context(cafile=str(tls_ca) if tls_ca else None) if url.startswith("https") else None
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as reply:
            code = reply.status
    except urllib.error.HTTPError as exc:
        code = exc.code
    except (urllib.error.URLError, OSError) as exc:
        typer.echo(f"{url}: {getattr(exc, 'reason', exc)}", err=True)
        raise typer.Exit(code=1)
    typer.echo(f"{url}: {code}")
    raise typer.Exit(code=0 if 200 <= code < 300 else 1)


@app.command("health")
def health(
    address: Annotated[
        str,
        typer.Argument(
            help="HOST:PORT of a FAST service (sim-server, learner, broker), or the gateway's http(s)://HOST:PORT/healthz."
        ),
    ],
    timeout_s: Annotated[float, typer.Option(min=0.1, help="Deadline of the check.")] = 3.0,
    tls_ca: Annotated[Optional[Path], typer.Option(help="TLS: the CA that signed the service's certificate.")] = None,
    tls_cert: Annotated[
        Optional[Path], typer.Option(help="TLS: a client certificate, for a service that requires one.")
    ] = None,
    tls_key: Annotated[Optional[Path], typer.Option(help="TLS: the client certificate's private key.")] = None,
    tls_server_name: Annotated[
        Optional[str], typer.Option(help="TLS: the name the service's certificate holds, if not ADDRESS's host.")
    ] = None,
) -> None:
    """Ask a service's standard gRPC health service; exit 0 when it is SERVING, 1 otherwise.

    For container health checks and readiness scripts: `fast health 127.0.0.1:50051`. The health
    service needs no run token; a service with TLS needs the --tls-* options (docs/security.md).
    An http:// or https:// URL (the gateway's /healthz) is asked with GET: exit 0 on a 2xx answer.
    """
    if address.startswith(("http://", "https://")):
        _http_health(address, timeout_s, tls_ca)
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from fast.tls import TlsFiles, channel_credentials, channel_options

    try:
        tls = TlsFiles(tls_cert, tls_key, tls_ca, tls_server_name)
        channel = (
            grpc.secure_channel(address, channel_credentials(tls), options=channel_options(tls))
            if tls.on
            else grpc.insecure_channel(address)
        )
    except ValueError as exc:
        _fail(str(exc))
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError as exc:
            typer.echo(f"{address}: {exc.code().name}: {exc.details()}", err=True)
            raise typer.Exit(code=1)
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    typer.echo(f"{address}: {status}")
    raise typer.Exit(code=0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1)


if __name__ == "__main__":
    app()

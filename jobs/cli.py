"""`fast`: one command-line entry point, a subcommand per service and per job."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from pydantic import BaseModel

from broker.config import BrokerConfig
from fast.config import ConfigError, resolve_config
from fast.lifecycle import exit_with_parent
from fast.settings import given, options
from gateway.settings import GatewaySettings
from jobs.advise.config import AdviseConfig
from jobs.bench.config import DEFAULTS as BENCH_TRAIN_DEFAULTS
from jobs.bench.config import SamplingBenchConfig, TrainBenchConfig
from jobs.train.config import TrainConfig
from learner.config import LearnerConfig
from sim_server.config import SimServerConfig

app = typer.Typer(
    help="FAST: aligned sampling and training for parallel on-policy RL.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ConfigFile = Annotated[
    Optional[Path], typer.Option("--config", help="YAML file of settings (flags and env vars override it).")
]


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


# The options of the service commands and `fast train` are their models' fields (fast/settings.py):
# one flag per setting, with the model's help, range and default.


@app.command("sim-server")
@options(SimServerConfig)
def sim_server(settings: dict[str, Any], config: ConfigFile = None) -> None:
    """Serve a simulator (the built-in takeover workload or a Gymnasium env) over gRPC.

    Settings also come from FAST_SIM_<NAME> environment variables (e.g. FAST_SIM_SLOTS=16) or the --config file.
    """
    from sim_server.config import ENV_PREFIX
    from sim_server.server import serve

    _serve(SimServerConfig, ENV_PREFIX, serve, config, settings)


@app.command("learner")
@options(LearnerConfig)
def learner(settings: dict[str, Any], config: ConfigFile = None) -> None:
    """Serve the learner (SMPO-PPO, policy versions, checkpoints) over gRPC.

    Every setting, PPO hyper-parameters included, also comes from FAST_LEARNER_<NAME>
    environment variables (e.g. FAST_LEARNER_GAMMA=0.995) or the --config file; see docs/learner.md.
    """
    from learner.config import ENV_PREFIX
    from learner.server import serve

    _serve(LearnerConfig, ENV_PREFIX, serve, config, settings)


@app.command("broker")
@options(BrokerConfig)
def broker(settings: dict[str, Any], config: ConfigFile = None) -> None:
    """Run the rollout broker: sample with DPSA (or a baseline mode) and train through the learner.

    Settings also come from FAST_BROKER_<NAME> environment variables or the --config file.
    Exits 0 when its iterations are done, 1 when the run failed.
    """
    from broker.config import ENV_PREFIX
    from broker.server import serve

    raise typer.Exit(code=_serve(BrokerConfig, ENV_PREFIX, serve, config, settings))


@app.command("gateway")
@options(GatewaySettings)
def gateway(settings: dict[str, Any], config: ConfigFile = None) -> None:
    """Serve the REST gateway: status and control of a run, Prometheus /metrics and a dashboard at /.

    Mutating calls need the run's token (FAST_AUTH_TOKEN or FAST_AUTH_TOKEN_FILE, as the services);
    settings also come from FAST_GATEWAY_<NAME> environment variables or the --config file; see docs/gateway.md.
    """
    from gateway.server import serve
    from gateway.settings import ENV_PREFIX

    _serve(GatewaySettings, ENV_PREFIX, serve, config, settings)


@app.command("train")
@options(TrainConfig)
def train(settings: dict[str, Any], config: ConfigFile = None) -> None:
    """Train on the local stack: K simulator servers, learner and broker as processes; then evaluate and report.

    Writes runs/<name>/ (config.yaml, metrics.jsonl, tb/, checkpoints/, eval.json, report.md, plots).
    Settings also come from FAST_TRAIN_<NAME> environment variables or the --config file; see docs/train.md.
    Exits 0 when done, 1 when the run failed, 128+N when stopped by signal N.
    """
    from jobs.train.config import ENV_PREFIX
    from jobs.train.orchestrate import TrainError
    from jobs.train.orchestrate import train as run_training

    try:
        cfg = resolve_config(TrainConfig, file=config, env_prefix=ENV_PREFIX, overrides=settings)
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


# The benchmarks' options take their defaults from their configs (jobs/bench/config.py), which do not load torch.


def _text(values: tuple) -> str:
    return ",".join(str(v) for v in values)


def _on_off_text(values: tuple[bool, ...]) -> str:
    return ",".join("on" if v else "off" for v in values)


@bench_app.command("sampling")
def bench_sampling(
    ctx: typer.Context,
    modes: Annotated[str, typer.Option(help="Sampling modes, comma-separated.")] = _text(SamplingBenchConfig.modes),
    clips: Annotated[str, typer.Option(help="Clip counts (parallel slots), comma-separated.")] = _text(
        SamplingBenchConfig.clips
    ),
    preset: Annotated[
        str, typer.Option(help="Cost presets, comma-separated (docs/cost_model.md); with --simulators: none.")
    ] = _text(SamplingBenchConfig.presets),
    servers: Annotated[int, typer.Option(min=1, help="Simulator server processes.")] = SamplingBenchConfig.servers,
    simulators: Annotated[
        Optional[str],
        typer.Option(
            help="Measure simulator servers that run already: HOST:PORT[,HOST:PORT...] or dns:///NAME:PORT "
            "(their own costs; none started or stopped; the environment's run token; --preset/--servers/--env/"
            "--gym-reference then do not apply)."
        ),
    ] = None,
    repeats: Annotated[
        int, typer.Option(min=1, help="Interleaved repeats; medians are reported.")
    ] = SamplingBenchConfig.repeats,
    samples: Annotated[
        int, typer.Option(min=1, help="Valid transitions per measured iteration.")
    ] = SamplingBenchConfig.samples,
    alpha: Annotated[float, typer.Option(help="FAST termination-rate threshold.")] = SamplingBenchConfig.alpha,
    t_max: Annotated[int, typer.Option(help="FAST round length limit.")] = SamplingBenchConfig.t_max,
    truncation: Annotated[
        str,
        typer.Option(
            help="FAST at a round's end: carry live episodes on, reset them, or carry,reset for both "
            "(rows fast+carry, fast+reset)."
        ),
    ] = _text(SamplingBenchConfig.truncations),
    seed: Annotated[
        int, typer.Option(help="Seed of clip dealing, actions and the random policy.")
    ] = SamplingBenchConfig.seed,
    checkpoint_dir: Annotated[
        Optional[Path], typer.Option(help="A fast train run's checkpoints/: adds the trained policy.")
    ] = SamplingBenchConfig.checkpoint_dir,
    gym_reference: Annotated[
        bool,
        typer.Option(
            help="Also measure Gymnasium's AsyncVectorEnv with autoreset (takeover only); off with --simulators."
        ),
    ] = SamplingBenchConfig.gym_reference,
    env: Annotated[
        str, typer.Option(help="Workload: takeover, or gym:<id> such as gym:highway_env:highway-fast-v0.")
    ] = SamplingBenchConfig.env,
    ver_per_slot: Annotated[
        bool, typer.Option(help="Also measure VER stepping one slot per Step call (rows ver+perslot), as it was.")
    ] = SamplingBenchConfig.ver_per_slot,
    locality: Annotated[
        str,
        typer.Option(
            help="Clip dealing with map locality: off, on, or off,on for both (rows MODE+locality; docs/bench.md)."
        ),
    ] = _on_off_text(SamplingBenchConfig.locality),
    locality_max_repeat: Annotated[
        int, typer.Option(min=1, help="Locality's diversity knob: clips of one map a server gets in a row.")
    ] = SamplingBenchConfig.locality_max_repeat,
    prefetch: Annotated[
        str,
        typer.Option(
            help="Load slots' next clips while they step (fast.v1 Prepare): off, on, or off,on for both "
            "(rows MODE+prefetch)."
        ),
    ] = _on_off_text(SamplingBenchConfig.prefetch),
    prefetch_step_penalty: Annotated[
        str,
        typer.Option(
            help="Fractions of the step latency added while a background load runs, comma-separated; each "
            "value gets servers of its own (rows PRESET+penalty<value>; only presets with step and load costs); "
            "with --simulators: 0."
        ),
    ] = _text(SamplingBenchConfig.prefetch_step_penalties),
    length_samples: Annotated[
        int,
        typer.Option(min=0, help="Steady-state episode lengths: valid transitions counted per configuration; 0 skips."),
    ] = SamplingBenchConfig.length_samples,
    warmup_steps: Annotated[
        int,
        typer.Option(
            min=0, help="Warm-up steps per slot before each measured iteration (at least 256 samples in all)."
        ),
    ] = SamplingBenchConfig.warmup_steps,
    length_warmup_steps: Annotated[
        int, typer.Option(min=0, help="Steady-state episode lengths: warm-up steps per slot before counting.")
    ] = SamplingBenchConfig.length_warmup_steps,
    out: Annotated[
        Optional[Path], typer.Option(help="Output directory. \\[default: runs/bench-sampling-<timestamp>]")
    ] = None,
) -> None:
    """Every sampling mode at every clip count and cost preset, interleaved: JSON, a markdown table, PNG charts."""
    import time as _time

    from jobs.bench.config import EXTERNAL
    from jobs.bench.sampling import run
    from jobs.external import inapplicable

    try:
        external = bool(simulators)
        refused = [
            f"--{name.replace('_', '-')}" for name in ("preset", "servers", "env", "gym_reference") if given(ctx, name)
        ]
        if external and refused:
            raise ValueError(inapplicable(refused))
        penalties = "0" if external and not given(ctx, "prefetch_step_penalty") else prefetch_step_penalty
        cfg = SamplingBenchConfig(
            modes=_csv(modes, str, "--modes"),
            clips=_csv(clips, int, "--clips"),
            presets=(EXTERNAL,) if external else _csv(preset, str, "--preset"),
            servers=servers,
            simulators=_csv(simulators or "", str, "--simulators"),
            repeats=repeats,
            samples=samples,
            alpha=alpha,
            t_max=t_max,
            truncations=_csv(truncation, str, "--truncation"),
            seed=seed,
            checkpoint_dir=checkpoint_dir,
            gym_reference=gym_reference and not external,
            env=env,
            length_samples=length_samples,
            warmup_steps=warmup_steps,
            length_warmup_steps=length_warmup_steps,
            locality=_on_off(locality, "--locality"),
            ver_per_slot=ver_per_slot,
            prefetch=_on_off(prefetch, "--prefetch"),
            prefetch_step_penalties=_csv(penalties, float, "--prefetch-step-penalty"),
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
            help="Sampling modes, comma-separated, auto among them (--mode auto: the run chooses as it goes); "
            "a mode may add +locality and/or +prefetch (e.g. fast+locality)."
        ),
    ] = _text(TrainBenchConfig.modes),
    clips: Annotated[
        Optional[int],
        typer.Option(min=1, help=f"Parallel clips (slots) of every run; unset: {BENCH_TRAIN_DEFAULTS['clips']}."),
    ] = TrainBenchConfig.clips,
    seeds: Annotated[int, typer.Option(min=1, help="Seeds per mode.")] = TrainBenchConfig.seeds,
    servers: Annotated[
        Optional[int],
        typer.Option(min=1, help=f"Simulator server processes per run; unset: {BENCH_TRAIN_DEFAULTS['servers']}."),
    ] = TrainBenchConfig.servers,
    preset: Annotated[
        Optional[str],
        typer.Option(help=f"Cost preset (docs/cost_model.md); unset: {BENCH_TRAIN_DEFAULTS['preset']}."),
    ] = TrainBenchConfig.preset,
    simulators: Annotated[
        Optional[str],
        typer.Option(
            help="Train and evaluate on simulator servers that run already: HOST:PORT[,HOST:PORT...] or "
            "dns:///NAME:PORT (none started or stopped; the environment's run token; --clips/--servers/--preset "
            "then do not apply)."
        ),
    ] = None,
    iterations: Annotated[int, typer.Option(min=1, help="Iterations per run.")] = TrainBenchConfig.iterations,
    samples_per_iteration: Annotated[
        int, typer.Option(min=1, help="Valid transitions per iteration.")
    ] = TrainBenchConfig.samples_per_iteration,
    update_epochs: Annotated[
        int, typer.Option(min=1, help="PPO epochs per iteration.")
    ] = TrainBenchConfig.update_epochs,
    checkpoint_every: Annotated[
        int, typer.Option(min=1, help="Evaluate every K-th policy version on held-out clips.")
    ] = TrainBenchConfig.checkpoint_every,
    eval_episodes_per_clip: Annotated[
        int, typer.Option(min=1, help="Held-out episodes per clip at each evaluated version.")
    ] = TrainBenchConfig.eval_episodes_per_clip,
    target_return: Annotated[
        Optional[float],
        typer.Option(
            help=f"Held-out return whose wall-clock is reported (unset: {TrainBenchConfig.target_return:g} for a new "
            "benchmark; with --report-only, recomputed for this target, or the stored one when not given)."
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

    from jobs.bench.train import rewrite_report, run

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


@app.command("advise")
@options(AdviseConfig)
def advise(
    settings: dict[str, Any],
    config: ConfigFile = None,
    json_path: Annotated[
        Optional[str],
        typer.Option(
            "--json",
            metavar="PATH",
            help="Also write everything as JSON to PATH; --json - writes it to stdout (and the table to stderr).",
        ),
    ] = None,
) -> None:
    """Measure the simulators, predict every sampling mode, recommend one and validate the best two (docs/advisor.md).

    Settings also come from FAST_ADVISE_<NAME> environment variables or the --config file.
    Exits 0 when done, 2 for bad settings or simulators it cannot use, 1 when a measurement failed.
    """
    from jobs.advise.config import ENV_PREFIX
    from jobs.advise.report import as_json, text
    from jobs.advise.run import run

    try:
        cfg = resolve_config(AdviseConfig, file=config, env_prefix=ENV_PREFIX, overrides=settings)
    except ConfigError as exc:
        _fail(str(exc))
    try:
        result = run(cfg, log=lambda message: typer.echo(message, err=True))
    except ValueError as exc:  # the simulators cannot be used as given (jobs/external.py), or the checkpoint
        _fail(str(exc))
    except (RuntimeError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1) from None
    typer.echo(text(result), err=json_path == "-")
    if json_path == "-":
        typer.echo(as_json(result))
    elif json_path is not None:
        Path(json_path).write_text(as_json(result) + "\n")
        typer.echo(f"wrote {json_path}", err=True)


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
    from fast.health import check

    try:
        healthy, line = check(address, timeout_s, tls_ca, tls_cert, tls_key, tls_server_name)
    except ValueError as exc:
        _fail(str(exc))
    typer.echo(line, err=not healthy)
    raise typer.Exit(code=0 if healthy else 1)


if __name__ == "__main__":
    app()

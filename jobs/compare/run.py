"""`fast compare`: the final policies of two groups of runs on the same held-out episodes, per metric
the difference of means with its jackknife 95% CI (jobs/compare/jackknife.py, docs/compare.md).

Order of life:
1. read every run directory (config.yaml, newest checkpoint) and refuse, naming the run, what
   does not fit: a missing file, another environment or catalog, other spaces;
2. start `servers` simulator servers with the runs' workload (stopped in a finally), or, with
   `simulators`, use servers that run already (jobs/external.py: the environment's token; their
   description must fit the runs' workload; never stopped);
3. play every final policy, deterministically, on the same (held-out clip, seed) episodes;
4. per metric, per clip: group A's mean over its runs and seeds minus group B's; the jackknife
   over clips gives the CI;
5. write compare.json and compare.md to out_dir.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import yaml

from broker.dealer import HOLDOUT_EVERY
from broker.evaluate import EvaluationSession, evaluation_episodes
from fast.rpc import Credentials
from fast.spaces import SpaceSpec, describe_space, spaces_equal
from jobs.compare.jackknife import LEVEL, PairedDifference, paired_difference, t_quantile
from jobs.external import ExternalSimulators, check_simulators, inapplicable
from jobs.simulators import Workload, job_simulators
from learner.checkpoint import Checkpoint, CheckpointError, load_latest, policy_weights

FORMAT = "jobs.compare/1"
# Episode fields that identify the episode rather than measure the driving.
_NOT_METRICS = ("clip_id", "seed")
# Listed first in the table, in this order (the environment's own metrics follow by name).
_HEADLINE = ("return", "length", "terminated", "collided", "off_road")
# Flags of `fast sim-server` that change what a clip is, and the variables that set them.
_CATALOG_FLAGS = ("--seed", "--num-clips", "--env-kwarg")
_CATALOG_VARIABLES = {"FAST_SIM_SEED": "--seed", "FAST_SIM_NUM_CLIPS": "--num-clips"}
# The simulator servers compare starts when it is given no --simulators.
DEFAULT_SERVERS, DEFAULT_SLOTS = 2, 8


class CompareError(ValueError):
    """The runs cannot be compared as given; the message names the run, the value and the fix."""


@dataclass(frozen=True)
class RunInfo:
    group: str
    path: Path
    workload: Workload
    mode: str
    train_seed: int | None
    checkpoint: Checkpoint
    weights: bytes  # the checkpoint's policy, learner.policy.export_weights bytes


# -- 1. the run directories ---------------------------------------------------------------------


def inspect_run(path: Path, group: str) -> RunInfo:
    """Read one run directory written by `fast train`; CompareError naming it if it cannot be compared."""
    path = Path(path)
    where = f"run {path} (group {group})"
    if not path.is_dir():
        raise CompareError(
            f"{where} does not exist or is not a directory; pass run directories written by `fast train`"
        )
    config_file = path / "config.yaml"
    if not config_file.is_file():
        raise CompareError(f"{where} has no config.yaml; pass a run directory written by `fast train`")
    try:
        document = yaml.safe_load(config_file.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise CompareError(f"{where}: {config_file} is unreadable ({exc})") from None
    train = document.get("train") if isinstance(document, dict) else None
    external = document.get("simulators") if isinstance(document, dict) else None
    if not isinstance(train, dict) or not (isinstance(train.get("env"), str) or isinstance(external, dict)):
        raise CompareError(f"{where}: {config_file} lacks train.env; it is not a `fast train` config.yaml")
    try:
        checkpoint = load_latest(path / "checkpoints")
    except CheckpointError as exc:
        raise CompareError(f"{where}: {exc}") from None
    if checkpoint is None:
        raise CompareError(
            f"{where} has no checkpoint in {path / 'checkpoints'}; the learner writes one when the run "
            "starts and every --checkpoint-every versions, so this run never got that far"
        )
    holdout_every = document.get("holdout_every", HOLDOUT_EVERY)
    if isinstance(holdout_every, bool) or not isinstance(holdout_every, int) or holdout_every < 1:
        raise CompareError(f"{where}: {config_file} has holdout_every {holdout_every!r}; expected an integer >= 1")
    workload = (
        _external_workload(external, holdout_every, where)
        if isinstance(external, dict)
        else Workload(train["env"], _catalog_args(document.get("processes")), holdout_every)
    )
    seed = train.get("seed")
    seed = seed if isinstance(seed, int) else None
    try:
        weights = policy_weights(checkpoint)  # a checkpoint that does not load fails here, before any server
    except CheckpointError as exc:
        raise CompareError(f"{where}: {exc}") from None
    return RunInfo(group, path, workload, str(train.get("mode", "?")), seed, checkpoint, weights)


def _external_workload(record: dict, holdout_every: int, where: str) -> Workload:
    """The workload of a run on external simulators: what their Describe said (config.yaml `simulators`)."""
    servers = record.get("servers")
    first = servers[0] if isinstance(servers, list) and servers and isinstance(servers[0], dict) else {}
    env_id, clips = first.get("env_id"), first.get("num_clips")
    if not isinstance(env_id, str) or isinstance(clips, bool) or not isinstance(clips, int):
        raise CompareError(
            f"{where}: config.yaml lists external simulators without their env_id and num_clips; "
            "it is not a `fast train --simulators` config.yaml"
        )
    return Workload(env_id, (), holdout_every, external_clips=clips)


def _catalog_args(processes: object) -> tuple[str, ...]:
    """The catalog-shaping flags of the run's first simulator server command (config.yaml `processes`)."""
    if not isinstance(processes, dict):
        return ()
    for name in sorted(processes):
        entry = processes[name]
        command = entry.get("command") if isinstance(entry, dict) else None
        if not name.startswith("sim-server") or not isinstance(command, str):
            continue
        tokens = shlex.split(command)
        found: list[tuple[str, str]] = []
        for token in tokens:  # FAST_SIM_SEED=3 python -m fast sim-server ...
            key, sep, value = token.partition("=")
            if sep and key in _CATALOG_VARIABLES:
                found.append((_CATALOG_VARIABLES[key], value))
        for i, token in enumerate(tokens):
            flag, sep, value = token.partition("=")
            if flag in _CATALOG_FLAGS:
                if not sep:
                    value = tokens[i + 1] if i + 1 < len(tokens) else ""
                found.append((flag, value))
        # A flag overrides its variable; repeated --env-kwarg are all kept, in order.
        flags = {flag: value for flag, value in found if flag != "--env-kwarg"}
        kwargs = [value for flag, value in found if flag == "--env-kwarg"]
        return tuple(part for flag in sorted(flags) for part in (flag, flags[flag])) + tuple(
            part for value in kwargs for part in ("--env-kwarg", value)
        )
    return ()


def check_runs(groups: dict[str, list[Path]]) -> dict[str, list[RunInfo]]:
    """Every run of both groups, read and checked to share one workload and one pair of spaces."""
    if len(groups) != 2:
        raise CompareError(
            f"compare takes exactly two groups of runs, got {len(groups)} ({', '.join(groups) or 'none'})"
        )
    runs: dict[str, list[RunInfo]] = {}
    for group, paths in groups.items():
        if not paths:
            raise CompareError(
                f"group {group} has no run; pass at least one run directory (or a glob that matches one)"
            )
        seen: set[Path] = set()
        for path in paths:
            resolved = Path(path).resolve()
            if resolved in seen:
                raise CompareError(
                    f"run {path} is listed twice in group {group}; it would count twice in the group's mean"
                )
            seen.add(resolved)
        runs[group] = [inspect_run(path, group) for path in paths]
    everyone = [run for group_runs in runs.values() for run in group_runs]
    first = everyone[0]
    for run in everyone[1:]:
        if run.workload != first.workload:
            raise CompareError(
                f"run {run.path} (group {run.group}) was trained on {run.workload.describe()}, run {first.path} "
                f"(group {first.group}) on {first.workload.describe()}; compare runs of one workload only"
            )
        for name in ("observation_space", "action_space"):
            ours, theirs = getattr(run.checkpoint, name), getattr(first.checkpoint, name)
            if not spaces_equal(ours, theirs):
                raise CompareError(
                    f"run {run.path} (group {run.group}) has {name} {describe_space(ours)}, run {first.path} "
                    f"{describe_space(theirs)}; compare runs of one workload only"
                )
    return runs


# -- 2.-3. servers and evaluation ---------------------------------------------------------------


async def evaluate_policies(
    addresses: list[str],
    runs: list[RunInfo],
    *,
    episodes_per_clip: int,
    seed: int,
    credentials: Credentials | None = None,
) -> tuple[np.ndarray, int, dict[Path, list[dict]]]:
    """(held-out clips, catalog size, episodes of each distinct run) on one pool of the given servers.

    `credentials`: the servers' run token (None: the environment's)."""
    holdout_every = runs[0].workload.holdout_every
    async with EvaluationSession.connect(
        addresses, holdout_every=holdout_every, episodes_per_clip=episodes_per_clip, seed=seed, credentials=credentials
    ) as session:
        reference = runs[0].checkpoint
        for name in ("observation_space", "action_space"):
            served: SpaceSpec = getattr(session.pool, name)
            if not spaces_equal(served, getattr(reference, name)):
                raise CompareError(
                    f"the simulators serve {name} {describe_space(served)}, the runs' policies expect "
                    f"{describe_space(getattr(reference, name))} (run {runs[0].path})"
                )
        if session.clips.size < 2:
            raise CompareError(
                f"{session.clips.size} held-out clip(s) among {session.num_clips} with holdout_every="
                f"{holdout_every}; the jackknife over clips needs at least 2"
            )
        episodes: dict[Path, list[dict]] = {}
        for run in runs:
            key = run.path.resolve()
            if key in episodes:  # the same run in both groups: deterministic, played once
                continue
            checkpoint = run.checkpoint
            runner = session.policy(checkpoint.hidden_sizes, checkpoint.policy_version, run.weights)
            episodes[key] = await session.play(runner)
    return session.clips, session.num_clips, episodes


# -- 4. the statistics table --------------------------------------------------------------------


def metric_names(episode_lists: list[list[dict]]) -> list[str]:
    """Numeric fields present in every episode: the headline ones first, then the rest by name."""
    first = episode_lists[0][0]
    names = [
        name
        for name, value in first.items()
        if name not in _NOT_METRICS
        and isinstance(value, (int, float))
        and all(isinstance(e.get(name), (int, float)) for episodes in episode_lists for e in episodes)
    ]
    return sorted(names, key=lambda name: (_HEADLINE.index(name) if name in _HEADLINE else len(_HEADLINE), name))


def clip_matrix(episode_lists: list[list[dict]], clips: np.ndarray, episodes_per_clip: int, metric: str) -> np.ndarray:
    """[clips, runs * episodes_per_clip]: row c holds every value of `metric` on clips[c] over the runs' episodes."""
    row_of = {int(clip): row for row, clip in enumerate(clips)}
    out = np.full((clips.size, len(episode_lists) * episodes_per_clip), np.nan)
    filled = np.zeros(clips.size, dtype=np.int64)
    for episodes in episode_lists:
        for episode in episodes:
            row = row_of[int(episode["clip_id"])]
            out[row, filled[row]] = float(episode[metric])
            filled[row] += 1
    if not (filled == out.shape[1]).all():
        row = int(np.flatnonzero(filled != out.shape[1])[0])
        raise RuntimeError(
            f"clip {int(clips[row])} has {int(filled[row])} episodes, expected {out.shape[1]} "
            f"({len(episode_lists)} runs x {episodes_per_clip})"
        )
    return out


def difference_table(
    episodes_a: list[list[dict]],
    episodes_b: list[list[dict]],
    clips: np.ndarray,
    episodes_per_clip: int,
    *,
    level: float = LEVEL,
) -> dict[str, dict]:
    """Per metric: means, A - B and its jackknife CI over clips, covers_zero, and the per-clip means."""
    table: dict[str, dict] = {}
    for metric in metric_names(episodes_a + episodes_b):
        a = clip_matrix(episodes_a, clips, episodes_per_clip, metric)
        b = clip_matrix(episodes_b, clips, episodes_per_clip, metric)
        result: PairedDifference = paired_difference(a, b, level=level, name=metric)
        table[metric] = {
            "mean_a": result.mean_a,
            "mean_b": result.mean_b,
            "difference": result.difference,
            "se": result.se,
            "ci_low": result.low,
            "ci_high": result.high,
            "covers_zero": result.covers_zero,
            "units": result.units,
            "df": result.df,
            "t": result.t,
            "per_clip_a": a.mean(axis=1).tolist(),
            "per_clip_b": b.mean(axis=1).tolist(),
        }
    return table


# -- 5. compare ---------------------------------------------------------------------------------


def compare(
    groups: dict[str, list[Path]],
    *,
    episodes_per_clip: int,
    seed: int,
    servers: int | None = None,
    slots: int | None = None,
    out_dir: Path,
    simulators: str | list[str] | None = None,
) -> dict:
    """Evaluate both groups' final policies on the same held-out episodes; write and return the comparison.

    `groups`: exactly two, {label: run directories}; the first is A, the second B (A - B).
    `servers` x `slots`: the simulator servers it starts (default 2 x 8); `simulators`: servers that run
    already, used instead (jobs/external.py), with which `servers` and `slots` do not apply.
    Writes out_dir/compare.json (the returned dict) and out_dir/compare.md. Raises
    CompareError for input that cannot be compared (before any server starts), ExternalSimulatorError
    (a ValueError) for external simulators that refuse or do not answer, RuntimeError when a simulator fails.
    """
    if simulators:
        given = [flag for flag, value in (("--servers", servers), ("--slots", slots)) if value is not None]
        if given:
            raise CompareError(inapplicable(given))
    else:
        servers = DEFAULT_SERVERS if servers is None else servers
        slots = DEFAULT_SLOTS if slots is None else slots
    for name, value in (("episodes_per_clip", episodes_per_clip), ("servers", servers), ("slots", slots)):
        if value is None and simulators:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CompareError(f"{name} must be an integer >= 1, got {value!r}")
    out_dir = Path(out_dir)
    if (out_dir / "compare.json").exists():
        raise CompareError(f"{out_dir} already holds a comparison (compare.json); pick another --out")
    runs = check_runs(groups)
    (label_a, runs_a), (label_b, runs_b) = runs.items()
    workload = runs_a[0].workload
    external = _external_simulators(simulators, workload, runs_a[0]) if simulators else None
    if external is None and workload.external:
        raise CompareError(
            f"run {runs_a[0].path} was trained on {workload.describe()}; fast compare cannot start such servers: "
            "pass --simulators with servers of that workload"
        )
    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)  # an unwritable --out fails now, not after the evaluation

    # Servers of its own, with a token of its own; or the external ones, as they are.
    with job_simulators(workload, servers or 0, slots or 0, external=external) as sims:
        clips, num_clips, episodes = asyncio.run(
            evaluate_policies(
                sims.addresses,
                runs_a + runs_b,
                episodes_per_clip=episodes_per_clip,
                seed=seed,
                credentials=sims.credentials,
            )
        )

    episodes_a = [episodes[run.path.resolve()] for run in runs_a]
    episodes_b = [episodes[run.path.resolve()] for run in runs_b]
    metrics = difference_table(episodes_a, episodes_b, clips, episodes_per_clip)
    clip_ids, episode_seeds = evaluation_episodes(clips, episodes_per_clip, seed)
    result = {
        "format": FORMAT,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "out_dir": str(out_dir),
        "level": LEVEL,
        "unit": "held-out clip",
        "groups": {
            "a": {"label": label_a, "runs": [_run_entry(run, episodes) for run in runs_a]},
            "b": {"label": label_b, "runs": [_run_entry(run, episodes) for run in runs_b]},
        },
        "evaluation": {
            "env": workload.env,
            "catalog_args": list(workload.catalog_args),
            "num_clips": num_clips,
            "holdout_every": workload.holdout_every,
            "clips": clips.tolist(),
            "episodes_per_clip": episodes_per_clip,
            "seed": seed,
            "episode_seeds": episode_seeds.tolist(),  # aligned with episode_clips
            "episode_clips": clip_ids.tolist(),
            "actions": "deterministic (the policy's mean action)",
            "servers": len(external.servers) if external is not None else servers,
            "slots": external.num_slots if external is not None else slots,
            **({"simulators": external.record()} if external is not None else {}),
            "eval_time_s": time.perf_counter() - started,
        },
        "metrics": metrics,
        "covering": sum(entry["covers_zero"] for entry in metrics.values()),
        "total": len(metrics),
    }
    (out_dir / "compare.json").write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    (out_dir / "compare.md").write_text(render_markdown(result))
    return result


def _external_simulators(simulators: str | list[str], workload: Workload, first: RunInfo) -> ExternalSimulators:
    """The external simulators, checked against the runs' workload as far as their Describe tells."""
    external = check_simulators(simulators)
    problem = workload.mismatch(external.env_id, external.num_clips)
    if problem:
        raise CompareError(
            f"the simulators of --simulators ({', '.join(external.specs)}) do not serve the runs' workload: "
            f"{problem} (run {first.path} was trained on {workload.describe()})"
        )
    return external


def _run_entry(run: RunInfo, episodes: dict[Path, list[dict]]) -> dict:
    return {
        "run_dir": str(run.path),
        "mode": run.mode,
        "train_seed": run.train_seed,
        "policy_version": run.checkpoint.policy_version,
        "checkpoint": str(run.checkpoint.path),
        "hidden_sizes": list(run.checkpoint.hidden_sizes),
        "episodes": episodes[run.path.resolve()],
    }


def render_markdown(result: dict) -> str:
    """compare.md: the table, how many intervals cover zero, the runs and the evaluation set."""
    a, b = result["groups"]["a"], result["groups"]["b"]
    ev = result["evaluation"]
    pct = round(100 * result["level"])
    n = len(ev["clips"])
    lines = [
        f"# {a['label']} vs {b['label']}: closed-loop metrics",
        "",
        f"A = {a['label']} ({len(a['runs'])} runs), B = {b['label']} ({len(b['runs'])} runs). "
        f"Per metric: the means, A - B, and its delete-one jackknife {pct}% CI over the {n} held-out clips "
        f"(t quantile {_fmt(t_quantile(1 - (1 - result['level']) / 2, n - 1))}, {n - 1} df); "
        "see docs/compare.md.",
        "",
        f"| metric | mean A | mean B | A - B | {pct}% CI | covers 0 |",
        "| --- | ---: | ---: | ---: | --- | --- |",
    ]
    for name, m in result["metrics"].items():
        lines.append(
            f"| {name} | {_fmt(m['mean_a'])} | {_fmt(m['mean_b'])} | {_fmt(m['difference'])} | "
            f"[{_fmt(m['ci_low'])}, {_fmt(m['ci_high'])}] | {'yes' if m['covers_zero'] else '**no**'} |"
        )
    lines += [
        "",
        f"**{result['covering']} of {result['total']} intervals cover zero.** An interval that covers zero means "
        "this evaluation found no difference it could tell from clip-to-clip noise, not that the policies are "
        f"equal; with {result['total']} metrics at {pct}% each, about {result['total'] * (100 - pct) / 100:.1f} "
        "would exclude zero by chance alone if the groups were equal.",
        "",
        "## Runs",
        "",
        "| group | run | mode | train seed | policy version | checkpoint |",
        "| --- | --- | --- | --- | ---: | --- |",
    ]
    for key, group in (("A", a), ("B", b)):
        for run in group["runs"]:
            lines.append(
                f"| {key} | {run['run_dir']} | {run['mode']} | {run['train_seed']} | "
                f"{run['policy_version']} | {Path(run['checkpoint']).name} |"
            )
    catalog = " ".join(ev["catalog_args"]) or "default catalog"
    lines += [
        "",
        "## Evaluation set",
        "",
        f"- environment `{ev['env']}` ({catalog}), {ev['num_clips']} clips; held out (clip % {ev['holdout_every']} == "
        f"{ev['holdout_every'] - 1}): {n} clips {ev['clips']}",
        f"- {ev['episodes_per_clip']} episode(s) per clip, episode seeds from seed {ev['seed']}; every policy plays "
        f"the same {len(ev['episode_clips'])} (clip, seed) episodes to their end, {ev['actions']}",
        (
            f"- external simulators {', '.join(ev['simulators']['specs'])} ({ev['servers']} server(s), "
            f"{ev['slots']} slots, not started or stopped by compare); {ev['eval_time_s']:.1f} s"
            if "simulators" in ev
            else f"- {ev['servers']} simulator server(s) x {ev['slots']} slots; {ev['eval_time_s']:.1f} s"
        ),
        "",
    ]
    return "\n".join(lines)


def _fmt(value: float) -> str:
    return f"{value:.4g}"

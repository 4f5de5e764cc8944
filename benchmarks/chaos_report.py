"""The chaos benchmark's report: the machine it ran on (`context`), chaos.md (`markdown`, with
`notes_for`), chaos.json's encoder (`json_default`) and a run's lines in the log (`print_run`)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import grpc
import numpy as np


def context() -> dict:
    model = ""
    try:
        model = next(
            (x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in x),
            "",
        )
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "cpu": model or platform.processor(),
        "python": platform.python_version(),
        "grpc": grpc.__version__,
        "load_average": os.getloadavg(),
    }


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _fault_counts(run: dict) -> str:
    """What was done to whom, how often: 'sim-0: 4 sim-kill, 1 sim-stop; ...'."""
    counts: dict[str, dict[str, int]] = {}
    for event in run["fault_events"]:
        target = "learner" if event["target"] < 0 else f"sim-{event['target']}"
        counts.setdefault(target, {})
        counts[target][event["kind"]] = counts[target].get(event["kind"], 0) + 1
    return "; ".join(
        f"{target}: " + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
        for target, kinds in sorted(counts.items())
    )


# The figures table: a row's label, and the dotted path(s) of its value(s) in a run's result.
FIGURES = (
    ("iterations done / asked", "iterations_done / iterations_asked"),
    ("broker exit code", "broker_exit_code"),
    ("valid transitions learnt", "valid_transitions_learnt"),
    ("training window (s)", "training_window_s"),
    ("**valid transitions / s**", "valid_per_s"),
    ("sampling-only valid transitions / s", "sampling_valid_per_s"),
    ("SubmitBatch calls / distinct batches", "batches.submit_calls / batches.distinct"),
    (
        "accepted / refused stale / failed in transport",
        "batches.accepted / batches.refused_stale_calls / batches.transport_failed_calls",
    ),
    ("batches lost / accepted twice", "batches.distinct_lost / batches.accepted_twice"),
    ("batches sent again after a failed call, then accepted", "batches.sent_again_accepted"),
    ("learner's final version", "versions.learner_final_version"),
    ("valid transitions checked", "corruption.valid_transitions_checked"),
    ("... not produced by a simulator", "corruption.not_produced_by_a_simulator"),
    ("... taken from a corrupted answer", "corruption.from_a_corrupted_answer"),
    ("... non-finite / terminated and truncated", "corruption.non_finite_values / corruption.terminated_and_truncated"),
    (
        "duplicated / skipped versions: accepted batches",
        "versions.accepted_batches.duplicated / versions.accepted_batches.skipped",
    ),
    ("... metrics.jsonl", "versions.metrics_jsonl.duplicated / versions.metrics_jsonl.skipped"),
    ("... learner checkpoints", "versions.checkpoints.duplicated / versions.checkpoints.skipped"),
    ("longest gap without progress (s)", "progress.longest_gap_s"),
    ("hangs (a gap over its bound)", "progress.hangs"),
    ("slot-steps lost to faults (metrics.jsonl)", "metrics_faults"),
    ("broker log: simulator down / re-admitted", "broker_log.simulator_down / broker_log.readmitted"),
    ("failed readmission attempts / seconds they took", "failed_describes.count / failed_describes.total_s"),
)


def markdown(result: dict) -> str:
    cfg, runs = result["config"], result["runs"]
    chaos = runs["chaos"]
    base = runs.get("baseline")
    lines = [
        "# Chaos: one `fast`-mode run while its processes are killed, frozen and lied to",
        "",
        f"    {result['command']}",
        "",
        f"{result['context']['cores']} cores ({result['context']['cpu']}), load average "
        f"{', '.join(f'{x:.1f}' for x in result['context']['load_average_start'])} at the start "
        f"(shared with other jobs); {cfg['servers']} simulator servers x {cfg['slots']} slots (takeover, "
        f"cost preset `{cfg['preset']}`), {cfg['iterations']} iterations of >= {cfg['samples']} valid samples, "
        f"seed {cfg['seed']}; broker step deadline {cfg['step_timeout_s']:g} s, stall timeout "
        f"{cfg['stall_timeout_s']:g} s, learner wait {cfg['learner_wait_s']:g} s; learner checkpoint every "
        f"{cfg['checkpoint_every']} version(s). Wall clock of the whole benchmark: {result['wall_clock_s']:.0f} s.",
        "",
        f"Faults injected in the chaos run: {_fault_counts(chaos)}.",
        "",
        "## Verdict",
        "",
        "| target | met |",
        "|---|---|",
        *[f"| {name} | {'yes' if ok else '**NO**'} |" for name, ok in chaos["verdict"].items()],
        "",
        "## Figures",
        "",
        "| | " + ("baseline (no faults) | " if base else "") + "chaos |",
        "|---|" + ("---:|" if base else "") + "---:|",
    ]

    def cell(r: dict, paths: str) -> str:
        """Values at dotted `paths` (several joined by ' / '); a list counts its items."""
        values = []
        for path in paths.split(" / "):
            value = r
            for key in path.split("."):
                value = value[key]
            values.append(_fmt(len(value) if isinstance(value, list) else value))
        return " / ".join(values)

    for name, paths in FIGURES:
        lines.append(f"| {name} | " + " | ".join(cell(r, paths) for r in ([base] if base else []) + [chaos]) + " |")
    if base and base["valid_per_s"] and chaos["valid_per_s"]:
        lines += ["", f"**Throughput with faults / without: {chaos['valid_per_s'] / base['valid_per_s']:.2f}**"]
    lines += [
        "",
        "## Faults and recovery (chaos run)",
        "",
        "Recovery: from the fault (SIGKILL, SIGSTOP, the corrupted answer, the learner's SIGKILL) to that "
        "simulator's first intact Step answer (the learner's first answer). *After resume*: from the process "
        "being back (listening again, SIGCONT) to that answer, the broker's share.",
        "",
        "| fault | injected | recovered | recovery: median (s) | max (s) | after resume: median (s) | max (s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind in ("sim-kill", "sim-stop", "garbage", "learner-kill"):
        rec, aft = chaos["recovery"].get(kind), chaos["recovery_after_resume"].get(kind)
        n = chaos["garbage"]["corrupted_answers"] if kind == "garbage" else chaos["faults_injected"].get(kind, 0)
        label = f"{kind} (corrupted answers)" if kind == "garbage" else kind
        if rec is None:
            lines.append(f"| {label} | {n} | 0 | - | - | - | - |")
            continue
        lines.append(
            f"| {label} | {n} | {rec['count']} | {_fmt(rec['median_s'])} | {_fmt(rec['max_s'])} | "
            f"{_fmt(aft['median_s'])} | {_fmt(aft['max_s'])} |"
        )
    g = chaos["garbage"]
    lines += [
        "",
        f"Garbage: {g['corrupted_answers']} corrupted answers "
        f"({', '.join(f'{k}: {v}' for k, v in g['by_kind'].items())}); "
        f"the broker logged {sum(g['broker_bad_answers_by_field'].values())} bad answers, by field "
        f"{g['broker_bad_answers_by_field']} (expected {g['expected_by_field']}).",
        "",
        "## What did not meet the target",
        "",
    ]
    failed = [name for name, ok in chaos["verdict"].items() if not ok]
    if base:
        failed += [f"baseline: {name}" for name, ok in base["verdict"].items() if not ok]
    lines += [f"- {name}" for name in failed] or ["Nothing: every target above was met."]
    notes = result.get("notes") or []
    if notes:
        lines += ["", "## Notes", "", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


def notes_for(result: dict) -> list[str]:
    """Plain statements of what the figures show beyond the verdict."""
    chaos, notes = result["runs"]["chaos"], []
    b = chaos["batches"]
    if b["refused_stale_calls"]:
        notes.append(
            f"{b['refused_stale_calls']} SubmitBatch call(s) refused as stale: the learner was at another version "
            "when the batch arrived (a restart from a checkpoint); the broker dropped the batch and sampled again."
        )
    if b["learner_versions_vs_accepted"]:
        notes.append(
            f"The learner's final version is {b['learner_versions_vs_accepted']:+d} against the batches it "
            "acknowledged: an update was trained (and checkpointed) but its answer never reached the broker."
        )
    late = chaos["run_ended_before_recovery"]
    if late:
        notes.append(
            f"Not counted as recoveries: {late} (fault kind: count), whose target was back less than a stall "
            "timeout before the run ended; the broker had no round left to take it back."
        )
    described = chaos["failed_describes"]
    if described["count"]:
        notes.append(
            f"{described['count']} readmission attempt(s) (Describe) to frozen simulators failed, "
            f"{described['total_s']:.1f} s in all: the broker awaits them at a round start "
            "(broker/samplers/lockstep.py `_start_round` -> `pool.readmit_due`), so the other simulators' "
            "slots wait as long."
        )
    for event in chaos["fault_events"]:
        if event["kind"] == "learner-kill":
            notes.append(
                f"The learner was SIGKILLed at iteration {event['iteration']} "
                + ("while it served a SubmitBatch; " if event.get("batch_in_flight") else "between SubmitBatch calls; ")
                + f"it was listening again {event['restart_s']:.1f} s later, resumed from its checkpoint. "
                f"{b['sent_again_accepted']} batch(es) were sent again after a failed call and accepted "
                "(an update cut by the kill is not in the checkpoint: the learner resumes at the batch's version)."
            )
    learner = chaos["recovery_after_resume"].get("learner-kill")
    if learner and learner["max_s"] is not None:
        notes.append(
            f"After the restarted learner listened, the broker's next call reached it {learner['max_s']:.1f} s "
            "later at most: its retry waits double up to 5 s (broker/run.py `_submit`)."
        )
    if chaos["faults_not_injected"]:
        notes.append(f"{len(chaos['faults_not_injected'])} planned fault(s) did not fire before the run ended.")
    if chaos["broker_tail"]:
        notes.append("The broker's last lines: " + " | ".join(chaos["broker_tail"]))
    return notes


def json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def print_run(r: dict, log) -> None:
    log(
        f"{r['label']}: {r['iterations_done']}/{r['iterations_asked']} iterations, "
        f"broker exit {r['broker_exit_code']}, "
        f"{_fmt(r['valid_per_s'], 0)} valid/s over {_fmt(r['training_window_s'], 1)} s; faults {r['faults_injected']}"
    )
    if r["fault_events"]:
        log(f"  faults: {_fault_counts(r)}")
    for kind, s in r["recovery"].items():
        log(f"  recovery {kind}: n={s['count']} median {_fmt(s['median_s'])} s, max {_fmt(s['max_s'])} s")
    log(f"  batches {r['batches']}")
    log(f"  corruption {r['corruption']}")
    log(f"  longest gap {r['progress']['longest_gap_s']:.1f} s; hangs {len(r['progress']['hangs'])}")
    for name, ok in r["verdict"].items():
        log(f"  {'ok ' if ok else 'NOT MET'} {name}")

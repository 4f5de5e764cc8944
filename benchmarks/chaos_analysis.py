"""What one chaos run's records show (`analyse`): batches, corruption, versions, hangs, recovery
and throughput, from the proxies' Ledger, the run's files and the broker's log; and the targets
met (`verdict`). benchmarks/chaos.py says what each check means."""

from __future__ import annotations

import json
import re
import statistics

from benchmarks.chaos_plan import ChaosConfig
from benchmarks.chaos_proxies import CORRUPTION_FIELD

_CKPT = re.compile(r"^ckpt-(\d+)\.pt$")
_BAD_ANSWER = re.compile(r"simulator (\S+) is down: bad answer \(\d+ in a row\): ([\w/]+)")
_DOWN = re.compile(r"simulator (\S+) is down: ")
_READMITTED = re.compile(r"simulator (\S+) re-admitted")


def _summary(values: list[float]) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"count": 0, "median_s": None, "max_s": None}
    return {"count": len(values), "median_s": statistics.median(values), "max_s": max(values)}


def _first_after(times: list[float], t: float) -> float | None:
    return next((x for x in times if x > t), None)


def _sequence_problems(versions: list[int]) -> dict:
    seen, duplicated = set(), []
    for v in versions:
        if v in seen:
            duplicated.append(v)
        seen.add(v)
    skipped = sorted(set(range(max(versions) + 1)) - seen) if versions else []
    in_order = versions == sorted(versions)
    return {"duplicated": sorted(set(duplicated)), "skipped": skipped, "in_order": in_order}


def analyse(cfg, label, ledger, stack, broker_code, timed_out, t_end, codes, broker_lines, learner_lines) -> dict:
    t0 = stack.t0
    metrics_path = stack.work / "metrics.jsonl"
    metrics = (
        [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()] if metrics_path.exists() else []
    )
    batches = ledger.batches
    accepted = [b for b in batches if b.get("outcome") == "accepted"]
    by_digest: dict[str, list[dict]] = {}
    for b in batches:
        by_digest.setdefault(b.get("digest", "?"), []).append(b)
    fates = {}
    for digest, tries in by_digest.items():
        outcomes = [t["outcome"] for t in tries]
        fates[digest] = (
            "accepted" if "accepted" in outcomes else ("refused-stale" if "refused-stale" in outcomes else "lost")
        )
    accepted_twice = sum(1 for tries in by_digest.values() if sum(t["outcome"] == "accepted" for t in tries) > 1)
    checkpoints = sorted(
        int(m.group(1)) for p in (stack.work / "checkpoints").glob("ckpt-*.pt") if (m := _CKPT.match(p.name))
    )
    final_version = checkpoints[-1] if checkpoints else None
    accepted_versions = [b["version"] for b in accepted]
    metric_versions = [int(m["policy_version"]) for m in metrics]
    replies_ok = all(b["reply_version"] == b["version"] + 1 for b in accepted)

    # Recovery: each fault to that target's first good answer after it was back. A fault with no
    # such answer is unrecovered, unless the run ended less than a stall timeout after it was back.
    recoveries: dict[str, list[float | None]] = {}
    after_resume: dict[str, list[float | None]] = {}
    unrecovered: dict[str, int] = {}
    ended_first: dict[str, int] = {}

    def account(kind: str, t_fault: float, t_resumed: float, times: list[float], event: dict) -> None:
        back = _first_after(times, t_resumed)
        event["recovered_s"] = None if back is None else back - t_fault
        event["after_resume_s"] = None if back is None else back - t_resumed
        if back is None:
            late = t_end - t_resumed < cfg.stall_timeout_s
            (ended_first if late else unrecovered)[kind] = (ended_first if late else unrecovered).get(kind, 0) + 1
            return
        recoveries.setdefault(kind, []).append(event["recovered_s"])
        after_resume.setdefault(kind, []).append(event["after_resume_s"])

    for f in ledger.faults:
        if f["injected"] and f["kind"] != "garbage":
            times = ledger.learner_ok if f["target"] < 0 else ledger.good_steps[f["target"]]
            account(f["kind"], f["t_fault"], f["t_resumed"], times, f)
    for c in ledger.corrupted:
        account("garbage", c["t"], c["t"], ledger.good_steps[c["sim"]], c)

    # Hangs: gaps without a valid step or an accepted batch, from the first reset to the broker's exit.
    progress = sorted([t for ts in ledger.good_steps.values() for t in ts] + [b["t_reply"] for b in accepted])
    start = ledger.first_reset or t0
    marks = [start, *[t for t in progress if t >= start], t_end]
    learner_down = [
        (f["t_fault"], _first_after(ledger.learner_ok, f["t_resumed"]) or t_end)
        for f in ledger.faults
        if f["injected"] and f["kind"] == "learner-kill"
    ]
    gaps = []
    for a, b in zip(marks, marks[1:]):
        during_learner_outage = any(lo <= b and a <= hi for lo, hi in learner_down)
        bound = cfg.learner_wait_s if during_learner_outage else cfg.stall_timeout_s
        gaps.append((b - a, a - t0, bound, during_learner_outage))
    longest = max(gaps, default=(0.0, 0.0, cfg.stall_timeout_s, False))
    hangs = [{"gap_s": g, "at_s": at, "bound_s": bound} for g, at, bound, _ in gaps if g > bound]

    # Throughput: valid transitions learnt per second, from the first reset to the last accepted batch.
    valid = sum(b["valid"] for b in accepted)
    window = (accepted[-1]["t_reply"] - start) if accepted else None
    sampling_s = sum(m["valid_transitions"] / m["effective_throughput"] for m in metrics if m["effective_throughput"])

    # What the broker said about the simulators (its log): faults, readmissions, bad answers by field.
    proxy_index = {p.address: p.index for p in stack.sim_proxies}
    bad_fields: dict[str, int] = {}
    bad_by_sim: dict[int, int] = {}
    down = readmitted = 0
    for line in broker_lines:
        if m := _BAD_ANSWER.search(line):
            bad_fields[m.group(2)] = bad_fields.get(m.group(2), 0) + 1
            bad_by_sim[proxy_index.get(m.group(1), -1)] = bad_by_sim.get(proxy_index.get(m.group(1), -1), 0) + 1
        if _DOWN.search(line):
            down += 1
        if _READMITTED.search(line):
            readmitted += 1
    corrupted_kinds: dict[str, int] = {}
    for c in ledger.corrupted:
        corrupted_kinds[c["kind"]] = corrupted_kinds.get(c["kind"], 0) + 1
    expected_fields: dict[str, int] = {}
    for kind, n in corrupted_kinds.items():
        expected_fields[CORRUPTION_FIELD[kind]] = expected_fields.get(CORRUPTION_FIELD[kind], 0) + n

    injected: dict[str, int] = {}
    for f in ledger.faults:
        if f["injected"]:
            injected[f["kind"]] = injected.get(f["kind"], 0) + 1
    corruption = {
        "valid_transitions_checked": sum(b["valid"] for b in batches),
        "not_produced_by_a_simulator": sum(b["unknown"] for b in batches),
        "from_a_corrupted_answer": sum(b["spoiled"] for b in batches),
        "non_finite_values": sum(b["nonfinite"] for b in batches),
        "terminated_and_truncated": sum(b["both_flags"] for b in batches),
        "undecodable_batches": sum(1 for b in batches if "undecodable" in b),
    }
    versions = {
        "accepted_batches": _sequence_problems(accepted_versions),
        "metrics_jsonl": _sequence_problems(metric_versions),
        "checkpoints": _sequence_problems(checkpoints),
        "replies_are_version_plus_one": replies_ok,
        "learner_final_version": final_version,
    }
    result = {
        "label": label,
        "iterations_asked": cfg.iterations,
        "iterations_done": len(metrics),
        "broker_exit_code": broker_code,
        "broker_timed_out": timed_out,
        "completed": broker_code == 0 and len(metrics) == cfg.iterations,
        "exit_codes": codes,
        "wall_s": t_end - t0,
        "training_window_s": window,
        "valid_transitions_learnt": valid,
        "valid_per_s": valid / window if window else None,
        "sampling_valid_per_s": sum(m["valid_transitions"] for m in metrics) / sampling_s if sampling_s else None,
        "faults_injected": injected,
        "faults_not_injected": [f for f in ledger.faults if not f["injected"]],
        "fault_events": [_relative(f, t0) for f in ledger.faults if f["injected"]],
        "recovery": {k: _summary(v) for k, v in sorted(recoveries.items())},
        "recovery_after_resume": {k: _summary(v) for k, v in sorted(after_resume.items())},
        "unrecovered": unrecovered,
        "run_ended_before_recovery": ended_first,
        "batches": {
            "submit_calls": len(batches),
            "distinct": len(by_digest),
            "accepted": len(accepted),
            "accepted_twice": accepted_twice,
            "refused_stale_calls": sum(1 for b in batches if b["outcome"] == "refused-stale"),
            "transport_failed_calls": sum(
                1 for b in batches if b["outcome"] not in ("accepted", "refused-stale", "pending")
            ),
            "unanswered_calls": sum(1 for b in batches if b["outcome"] == "pending"),
            "distinct_refused_stale": sum(1 for v in fates.values() if v == "refused-stale"),
            "distinct_lost": sum(1 for v in fates.values() if v == "lost"),
            # Sent more than once (a call failed, e.g. the learner was killed serving it) and then accepted.
            "sent_again_accepted": sum(
                1 for d, tries in by_digest.items() if len(tries) > 1 and fates[d] == "accepted"
            ),
            "learner_versions_vs_accepted": (final_version - len(accepted)) if final_version is not None else None,
        },
        "corruption": corruption,
        "versions": versions,
        "progress": {
            "longest_gap_s": longest[0],
            "longest_gap_at_s": longest[1],
            "longest_gap_bound_s": longest[2],
            "longest_gap_during_learner_outage": longest[3],
            "hangs": hangs,
        },
        "garbage": {
            "corrupted_answers": len(ledger.corrupted),
            "by_kind": corrupted_kinds,
            "broker_bad_answers_by_field": bad_fields,
            "expected_by_field": expected_fields,
            "broker_bad_answers_by_sim": {str(k): v for k, v in bad_by_sim.items()},
        },
        "broker_log": {"simulator_down": down, "readmitted": readmitted},
        # Readmission attempts (Describe) that failed while the simulator was up but frozen: each
        # held the broker's round start (broker/samplers/lockstep.py awaits readmit_due) this long.
        "failed_describes": {
            "count": sum(1 for d in ledger.describes if not d["ok"]),
            "total_s": sum(d["s"] for d in ledger.describes if not d["ok"]),
        },
        "metrics_faults": sum(int(m.get("faults", 0)) for m in metrics),
        "episode_ends_fault": sum(int(m.get("episode_ends", {}).get("fault", 0)) for m in metrics),
        "broker_tail": broker_lines[-8:] if broker_code != 0 else [],
        "learner_restarts": sum(1 for line in learner_lines if "listening on" in line) - 1,
        "processes_launched": len(stack.launched),
        "processes_left_running": stack.left_running,
    }
    result["verdict"] = verdict(cfg, result, bool(ledger.faults))
    return result


def _relative(event: dict, t0: float) -> dict:
    out = {}
    for k, v in event.items():
        out[k] = round(v - t0, 3) if k.startswith("t_") and isinstance(v, float) else v
    return out


def verdict(cfg: ChaosConfig, r: dict, chaos: bool) -> dict[str, bool]:
    """The targets, each true when met."""
    b, c, v = r["batches"], r["corruption"], r["versions"]
    checks = {
        "run completed": r["completed"],
        "no corrupted transition": all(
            c[k] == 0
            for k in (
                "not_produced_by_a_simulator",
                "from_a_corrupted_answer",
                "non_finite_values",
                "terminated_and_truncated",
                "undecodable_batches",
            )
        ),
        "no lost batch": b["distinct_lost"] == 0
        and b["unanswered_calls"] == 0
        and b["accepted"] == r["iterations_done"]
        and b["learner_versions_vs_accepted"] == 0,
        "no duplicated or skipped version": all(
            not s["duplicated"] and not s["skipped"] and s["in_order"]
            for s in (v["accepted_batches"], v["metrics_jsonl"], v["checkpoints"])
        )
        and v["replies_are_version_plus_one"]
        and b["accepted_twice"] == 0,
        "no hang": not r["progress"]["hangs"],
        "every process stopped at the end": not r["processes_left_running"],
    }
    if chaos:
        g = r["garbage"]
        checks["every fault recovered"] = not any(r["unrecovered"].values())
        checks["every garbage answer faulted by field"] = (
            g["broker_bad_answers_by_field"] == g["expected_by_field"] and g["corrupted_answers"] > 0
        ) or (cfg.garbage_s == 0)
        checks["all planned faults injected"] = not r["faults_not_injected"]
    return checks

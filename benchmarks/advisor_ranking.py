"""Does `fast advise` rank the modes as the real samplers measure them? (issue 30: the advisor's
ranking matches the measured one in every preset, both policies, 10 and 30 clips; its predicted
effective throughput within 20% of the measured one for the top two.)

    .venv/bin/python -m benchmarks.advisor_ranking --checkpoint benchmarks/results/trained-policy-v2 \\
        --out benchmarks/results/advisor-ranking/NAME
    .venv/bin/python -m benchmarks.advisor_ranking --presets off --clips 4 --repeats 1 --samples 128 --out /tmp/r

Per cost preset, on one pool of sim-server processes (`fast bench sampling`'s harness,
jobs/bench/harness.py, with slots for the largest clip count), for each fixed policy (random;
trained with --checkpoint) and clip count:

    advice     `fast advise`'s probe and prediction (jobs/advise/run.py `advise_on`): the servers'
               costs, the forward pass, the broker's part of a call, the episode lengths under that
               policy, then every mode with and without prefetch and locality; a mode's best variant
               is its row (sc, autoreset, sgr, ver, fast+carry, fast+reset)
    measured   each row's variant (mode, alpha, truncation, prefetch, locality, as the row names
               it) with the real sampler, as `fast advise` validates its top two (a fresh sampler, a
               warm-up iteration of 50 steps per clip, then measured iterations of `samples` valid
               transitions), `iterations` of them summarised as one, as the model plays them;
               `repeats` times, the median the figure. Each repeat shuffles every (policy, clips, row)
               of the preset, by default turn by turn: each row's turn a fresh sampler, its warm-up
               and one measured iteration, every row's turn before any row's next (`--interleave
               iteration`, INTERLEAVE says why); or each row's whole run at once (`--interleave run`,
               `fast advise`'s validation and `fast bench sampling`'s repeats)

The probe uses every slot of a server (the pool's servers hold slots for the largest clip count),
where `fast advise --clips 10` would start servers of 5 slots: the costs it fits are per call and
per slot, so the difference is which slots it times, not what it predicts for.

Verdicts per configuration (preset, policy, clips), on the six rows' effective throughputs:

    exact         the measured order is the predicted one
    within noise  every pair of modes the model orders otherwise than measurement has measured
                  figures within 10% of each other: |a - b| <= 0.10 max(a, b) (two modes that
                  close trade places between repeats; exact ranking is fragile there)
    settled       every pair of modes that measurement settles, each repeat of one above each
                  repeat of the other (their min-max ranges apart), is in the predicted order: the
                  ranking asked of the model where measurement has one. With one repeat every pair is
                  settled and this is `exact`; with three, two modes of equal speed are settled by
                  chance one time in ten (either way), so a miss on one pair is weak evidence
    kendall tau   (concordant - discordant pairs) / (n (n - 1) / 2); 1 same order, -1 reversed
                  (tau-a: a tie in either is neither)
    repeats' tau  beside the verdicts, not one of them: the mean Kendall tau between the orders of
                  every two repeats (repeat i of every mode against repeat j), how far measurement
                  reproduces its own order: the model cannot be held closer to one measurement than
                  that measurement is to the next
    repeats' exact  beside them too, `exact`'s counterpart: the share of every two repeats whose
                  orders are the same, against the share of repeats whose order is the predicted one
    top-1         the predicted first is the measured first
    top two       for each of the predicted first two, |predicted - measured| <= 0.20 measured
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from itertools import combinations
from pathlib import Path

import numpy as np

from benchmarks.options import PRESETS, checkpoint, count, counts, names, seed
from broker.advisor.model import ModeSettings, predict
from broker.advisor.records import inputs_from_record, inputs_record
from jobs.advise.choice import choose
from jobs.advise.config import SAMPLES_PER_10_CLIPS, AdviseConfig
from jobs.advise.run import advise_on, bench_config, json_safe, run_row
from jobs.bench.harness import fixed_policies, runner_for, runs_summary, simulator_pool

CLIPS = (10, 30)
NOISE = 0.10  # two measured figures this close are within noise of each other
# What a repeat shuffles. This machine's pace moves by 30% between blocks of a second (docs/advisor.md):
# a row whose whole run (its iterations back to back, 0.6 s on `off`) fell in a slow block measured
# slow, and `off`'s repeats put the modes in orders as far apart as tau 0.29. Turns of one iteration
# each (a fresh sampler, its warm-up, one measured iteration), every row's turn before any row's next,
# spread each row over the repeat's whole span, as the pace moves for all of them alike.
INTERLEAVE = ("iteration", "run")
TOP_TWO = 0.20  # predicted within this share of measured, for the predicted first two (issue 30)
VERDICTS = {
    "exact": "ranking exact",
    "within_noise": f"ranking within noise ({NOISE:.0%})",
    "settled": "every pair measurement settles in the predicted order",
    "top1": "predicted top-1 is the measured top-1",
    "top_two": f"top two predicted within {TOP_TWO:.0%} of measured",
}


def mode_label(settings: dict) -> str:
    """A row's mode as the ranking names it: fast+carry, fast+reset, or the mode."""
    return f"fast+{settings['truncation']}" if settings["mode"] == "fast" else settings["mode"]


def order(figures: dict[str, float]) -> list[str]:
    """The labels, highest figure first (a tie keeps the given order)."""
    return sorted(figures, key=lambda label: -figures[label])


def kendall_tau(a: dict[str, float], b: dict[str, float]) -> float:
    """Tau-a of two scorings of the same labels: (concordant - discordant) / pairs."""
    pairs = list(combinations(a, 2))
    if not pairs:
        return float("nan")
    score = sum(np.sign(a[x] - a[y]) * np.sign(b[x] - b[y]) for x, y in pairs)
    return float(score / len(pairs))


def swapped_pairs(predicted: dict[str, float], measured: dict[str, float]) -> list[tuple[str, str]]:
    """The pairs (x, y) the model puts x above y while measurement puts y above x."""
    return [
        (x, y) if predicted[x] > predicted[y] else (y, x)
        for x, y in combinations(predicted, 2)
        if (predicted[x] - predicted[y]) * (measured[x] - measured[y]) < 0
    ]


def within_noise(a: float, b: float, share: float = NOISE) -> bool:
    return abs(a - b) <= share * max(abs(a), abs(b))


def settled(a: list[float], b: list[float]) -> bool:
    """Measurement settles the order of two modes: every repeat of one above every repeat of the other."""
    return min(a) > max(b) or min(b) > max(a)


def repeat_figures(runs: dict[str, list[float]]) -> list[dict[str, float]]:
    """Each repeat's figures, repeat i of every mode (as many repeats as the mode measured least)."""
    return [{k: r[i] for k, r in runs.items()} for i in range(min(len(r) for r in runs.values()))]


def repeats_tau(runs: dict[str, list[float]]) -> float | None:
    """Mean Kendall tau between the orders of every two repeats; None under two."""
    taus = [kendall_tau(a, b) for a, b in combinations(repeat_figures(runs), 2)]
    return float(np.mean(taus)) if taus else None


def repeat_orders(runs: dict[str, list[float]]) -> list[list[str]]:
    """Each repeat's order of the modes."""
    return [order(figures) for figures in repeat_figures(runs)]


def repeats_exact(runs: dict[str, list[float]]) -> float | None:
    """The share of every two repeats whose orders are the same; None under two repeats."""
    same = [a == b for a, b in combinations(repeat_orders(runs), 2)]
    return float(np.mean(same)) if same else None


def validated_top1(predicted_order: list[str], measured_order: list[str], runs: dict[str, list[float]]) -> float:
    """How often `fast advise`'s recommendation is the measured first, when one repeat's figures of the
    predicted first two stand for its validation (jobs/advise/choice.py: the model's first unless the
    second measured more than 10% faster): the share of repeats."""
    rows = [{"label": label} for label in predicted_order]
    top = predicted_order[:2]
    picks = [
        choose(rows, [{"label": label, "measured_effective_throughput": runs[label][i]} for label in top]).row["label"]
        for i in range(min(len(runs[label]) for label in top))
    ]
    return float(np.mean([pick == measured_order[0] for pick in picks]))


def compare(
    predicted: dict[str, float], measured: dict[str, float], runs: dict[str, list[float]] | None = None
) -> dict:
    """Every verdict of the module docstring for one configuration's rows; `runs`, each mode's figure per
    repeat (repeat order), decides `settled` (without it, the medians: every pair settled)."""
    if set(predicted) != set(measured):
        raise ValueError(f"predicted {sorted(predicted)} and measured {sorted(measured)} name different modes")
    runs = runs or {label: [figure] for label, figure in measured.items()}
    predicted_order, measured_order = order(predicted), order(measured)
    swapped = swapped_pairs(predicted, measured)
    top_two = {
        label: {
            "ratio": measured[label] / predicted[label] if predicted[label] > 0 else float("nan"),
            "within": abs(predicted[label] - measured[label]) <= TOP_TWO * measured[label],
        }
        for label in predicted_order[:2]
    }
    return {
        "predicted_order": predicted_order,
        "measured_order": measured_order,
        "exact": predicted_order == measured_order,
        "swapped": [list(p) for p in swapped],
        "within_noise": all(within_noise(measured[x], measured[y]) for x, y in swapped),
        "settled": not any(settled(runs[x], runs[y]) for x, y in swapped),
        "unsettled_pairs": sum(not settled(runs[x], runs[y]) for x, y in combinations(predicted, 2)),
        "kendall_tau": kendall_tau(predicted, measured),
        "repeats_tau": repeats_tau(runs),
        "repeats_exact": repeats_exact(runs),
        "exact_per_repeat": float(np.mean([o == predicted_order for o in repeat_orders(runs)])),
        "top1": predicted_order[0] == measured_order[0],
        "validated_top1": validated_top1(predicted_order, measured_order, runs),
        "top_two": all(t["within"] for t in top_two.values()),
        "top_two_ratios": {label: t["ratio"] for label, t in top_two.items()},
    }


def summarise(advice: list[dict], measurements: list[dict]) -> list[dict]:
    """Per configuration: each mode's predicted figure, measured median (spread over repeats), ratio
    and ranks, with `compare`'s verdicts."""
    out = []
    for a in advice:
        key = (a["preset"], a["policy"], a["clips"])
        predicted, modes, per_repeat = {}, {}, {}
        for row in a["rows"]:
            label = mode_label(row["settings"])
            same = [m for m in measurements if (m["preset"], m["policy"], m["clips"], m["mode"]) == (*key, label)]
            same.sort(key=lambda m: m.get("repeat", 0))
            runs = per_repeat[label] = [m["effective_throughput"] for m in same]
            limits = [m["limit"] for m in same if m.get("limit") is not None]
            resets = [m["slot_resets_per_1k_valid"] for m in same if m.get("slot_resets_per_1k_valid") is not None]
            if not runs:
                raise ValueError(f"{key}: {label} has no measurement")
            predicted[label] = row["effective_throughput"]
            modes[label] = {
                "variant": row["label"],
                "predicted": row["effective_throughput"],
                "measured": statistics.median(runs),
                "spread": [min(runs), max(runs)],
                "repeats": len(runs),
                # What the measured costs allow the pattern measured (jobs/bench/limits.py), beside it.
                "limit": statistics.median(limits) if limits else None,
                # Slot resets per 1,000 valid transitions, the model's and the samplers' (median): a miss they
                # share is in the episodes drawn (the probe's lengths, or the measured seeds' luck), not in
                # the costs.
                "resets_predicted": row.get("slot_resets_per_1k_valid"),
                "resets_measured": statistics.median(resets) if resets else None,
            }
        verdicts = compare(predicted, {label: m["measured"] for label, m in modes.items()}, per_repeat)
        for label, m in modes.items():
            m["ratio"] = m["measured"] / m["predicted"] if m["predicted"] > 0 else float("nan")
            m["predicted_rank"] = verdicts["predicted_order"].index(label) + 1
            m["measured_rank"] = verdicts["measured_order"].index(label) + 1
        out.append({"preset": key[0], "policy": key[1], "clips": key[2], "modes": modes, **verdicts})
    return out


def targets(summary: list[dict]) -> dict[str, dict[str, int]]:
    """Per verdict, the configurations that met it and those that missed it."""
    return {
        name: {"met": sum(bool(s[name]) for s in summary), "missed": sum(not s[name] for s in summary)}
        for name in VERDICTS
    }


def _yes(value: bool) -> str:
    return "**yes**" if value else "no"


def _number(value: float | None, spec: str = ".0f") -> str:
    """A figure of the JSON, where NaN was written as None."""
    return "-" if value is None else format(value, spec)


def _iterations(cfg: dict) -> str:
    """The measured iterations of the run's config, in words: runs before the option measured one."""
    iterations = cfg.get("iterations", 1) or AdviseConfig.model_fields["iterations"].default
    return "one" if iterations == 1 else f"{iterations} iterations"


def _protocol(cfg: dict, samples: str) -> str:
    """How a repeat measured each row, in words (runs before `--interleave` shuffled whole runs)."""
    if cfg.get("interleave", "run") == "run":
        return (
            f"a warm-up iteration, then {_iterations(cfg)} of {samples}, as one figure; each repeat's rows in a "
            "shuffled order, a row's run at once"
        )
    iterations = cfg.get("iterations") or AdviseConfig.model_fields["iterations"].default
    return (
        f"{'one turn' if iterations == 1 else f'{iterations} turns'}, each a fresh sampler, its warm-up iteration "
        f"and one measured iteration of {samples}, as one figure; every row's turn before any row's next, each "
        "round of turns in a shuffled order"
    )


def report(result: dict) -> str:
    cfg = result["config"]
    wall = result.get("wall_clock_s")
    samples = (
        f"{cfg['samples']:,} valid transitions"
        if cfg["samples"]
        else (f"{SAMPLES_PER_10_CLIPS:,} valid transitions per 10 clips (rounded up)")
    )
    lines = [
        "# The advisor's ranking against measurement",
        "",
        f"`fast advise`'s probe and prediction, then every mode's row (its best predicted variant) measured with the "
        f"real sampler: {_protocol(cfg, samples)}; {cfg['repeats']} repeat(s), median (min-max in brackets); "
        f"{cfg['servers']} servers. "
        "Valid transitions per second." + (f" Whole run {wall / 60:.1f} min." if wall is not None else ""),
        "",
        f"Rules: *exact*, the measured order is the predicted one; *within noise*, every pair of modes the model "
        f"orders otherwise than measurement has measured figures within {NOISE:.0%} of each other "
        f"(|a - b| <= {NOISE:g} max(a, b)); *settled*, every pair of modes whose repeats measurement puts apart "
        "(each repeat of one above each repeat of the other) is in the predicted order (the pairs it leaves "
        "unsettled in brackets, of 15 for six modes); *tau*, Kendall's tau-a of the two orders; *repeats' tau*, "
        "the mean tau between every two repeats' orders (how far measurement reproduces itself); *top-1*, "
        "the predicted first is the measured first; *top two*, each of the predicted first two has "
        f"|predicted - measured| <= {TOP_TWO:g} measured (measured / predicted in brackets).",
        "",
        "| preset | policy | clips | predicted order | measured order | exact | within noise | settled (unsettled) | "
        "tau | repeats' tau | top-1 | top two |",
        "|---|---|---:|---|---|---|---|---|---:|---:|---|---|",
    ]
    for s in result["summary"]:
        ratios = ", ".join(_number(r, ".2f") for r in s["top_two_ratios"].values())
        lines.append(
            f"| {s['preset']} | {s['policy']} | {s['clips']} | {' > '.join(s['predicted_order'])} | "
            f"{' > '.join(s['measured_order'])} | {_yes(s['exact'])} | {_yes(s['within_noise'])} | "
            f"{_yes(s['settled'])} ({s['unsettled_pairs']}) | {_number(s['kendall_tau'], '.2f')} | "
            f"{_number(s['repeats_tau'], '.2f')} | {_yes(s['top1'])} | {_yes(s['top_two'])} ({ratios}) |"
        )
    lines += [
        "",
        "Per mode (the variant is the advisor's row: its best of prefetch and locality; limit: what the measured "
        "costs allow the pattern measured, jobs/bench/limits.py, median over repeats; resets: slot resets per "
        "1,000 valid transitions, predicted / measured):",
        "",
        "| preset | policy | clips | mode | variant | predicted | measured | limit | measured / predicted | "
        "rank predicted | rank measured | resets |",
        "|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in result["summary"]:
        for label in s["predicted_order"]:
            m = s["modes"][label]
            lines.append(
                f"| {s['preset']} | {s['policy']} | {s['clips']} | {label} | {m['variant']} | "
                f"{_number(m['predicted'])} | {m['measured']:.0f} [{m['spread'][0]:.0f}-{m['spread'][1]:.0f}] | "
                f"{_number(m.get('limit'))} | {_number(m['ratio'], '.2f')} | "
                f"{m['predicted_rank']} | {m['measured_rank']} | "
                f"{_number(m.get('resets_predicted'), '.1f')} / {_number(m.get('resets_measured'), '.1f')} |"
            )
    counts = targets(result["summary"])
    total = len(result["summary"])
    lines += ["", f"Targets, over {total} configuration(s):", ""]
    for name, text in VERDICTS.items():
        lines.append(f"- {text}: met in {counts[name]['met']}, missed in {counts[name]['missed']}")
    taus = [s["kendall_tau"] for s in result["summary"] if s["kendall_tau"] is not None]
    own = [s["repeats_tau"] for s in result["summary"] if s.get("repeats_tau") is not None]
    if taus and own:
        lines.append(
            f"- Kendall tau, mean over configurations: the model against the medians {np.mean(taus):.2f}, "
            f"one repeat against another {np.mean(own):.2f}"
        )
    own_exact = [s["repeats_exact"] for s in result["summary"] if s.get("repeats_exact") is not None]
    if own_exact:
        model_exact = sum(s["exact_per_repeat"] for s in result["summary"] if s.get("repeats_exact") is not None)
        lines.append(
            f"- Exact order, on average over configurations and repeats: one repeat's is another's in "
            f"{sum(own_exact):.1f} of {len(own_exact)}, the predicted one is a repeat's in {model_exact:.1f} "
            f"(the predicted one is the medians' in {counts['exact']['met']})"
        )
    validated = [s["validated_top1"] for s in result["summary"] if s.get("validated_top1") is not None]
    if validated:
        lines.append(
            f"- `fast advise`'s recommendation (its top two validated by one repeat's figures: the second only if "
            f"more than 10% faster) is the measured first: in {sum(validated):.1f} of {len(validated)} on average "
            f"over the repeats (the model's first alone: {counts['top1']['met']})"
        )
    if result.get("rescored_from"):
        what = "Verdicts"
        if result.get("repredicted"):
            seeds = result.get("repredicted_seeds")
            on = f"{seeds} seed(s) each" if seeds else "the seeds each recorded"
            what = f"Predictions made again by this version's model on the recorded inputs ({on}), and verdicts"
        lines += ["", f"{what} recomputed from the measurements of {result['rescored_from']} (nothing re-measured)."]
    return "\n".join(lines) + "\n"


def _advise_config(args: argparse.Namespace, preset: str, clips: int) -> AdviseConfig:
    """`fast advise`'s settings for one configuration: its defaults, but for the benchmark's options."""
    return AdviseConfig(
        preset=preset,
        servers=args.servers,
        clips=clips,
        checkpoint=args.checkpoint,
        samples=args.samples,
        seed=args.seed,
        **({"iterations": args.iterations} if args.iterations else {}),
        **({"model_seeds": args.model_seeds} if args.model_seeds else {}),
    )


def _advice_record(preset: str, policy: str, clips: int, advice, cfg: AdviseConfig) -> dict:
    return {
        "preset": preset,
        "policy": policy,
        "clips": clips,
        "alpha": advice.alpha,
        "episode_length_mean": advice.workload.lengths.mean,
        "call_s": advice.workload.call_s,
        "ver_slot_s": advice.workload.ver_slot_s,
        "row_server_s": advice.row.server_s,
        "row_cpu_s": advice.row.cpu_s,  # of call_s's row part, the broker thread's CPU (call_cpu_s, per call)
        # Measured, not all of it modelled, so that a later model can be played on it (`--repredict`):
        "call_receive_cpu_s": advice.call_receive_cpu_s,  # of a call's thread CPU, after its answer
        "receive_shares": [advice.probes[i].receive_share for i in advice.used],
        "one_call_s": advice.one_call_s,  # the probes' median call alone
        "ver_row_s": advice.ver_row_s,  # the broker's part of a row of VER's slot loops
        "inference": advice.inference,
        "timings_s": advice.timings_s,
        "rows": advice.rows,
        # The model's inputs, so that a later model can be run on them against these measurements
        # (`--repredict`); the seed is `fast advise`'s, the one every row was predicted with.
        "model_inputs": inputs_record(advice.workload, advice.horizon, seed=cfg.seed, seeds=cfg.model_seeds),
    }


async def _run_preset(args: argparse.Namespace, preset: str, log) -> tuple[list[dict], list[dict]]:
    """One preset's configurations on one pool: every advice first, then the measurements interleaved."""
    base = _advise_config(args, preset, max(args.clips))
    bench = bench_config(base, max(args.clips))
    advice, measurements = [], []
    async with simulator_pool(bench, preset) as pool:
        policies = fixed_policies(bench, pool)
        plan = []
        for policy, (hidden, weights) in policies.items():
            for clips in args.clips:
                started = time.perf_counter()
                cfg = _advise_config(args, preset, clips)
                a = await advise_on(cfg, pool, clips, policy, hidden, weights, log)
                advice.append(_advice_record(preset, policy, clips, a, cfg))
                plan += [(policy, clips, row) for row in a.rows]
                log(
                    f"{preset} {policy} clips={clips}: advised in {time.perf_counter() - started:.1f} s, "
                    f"predicted {' > '.join(mode_label(r['settings']) for r in a.rows)}"
                )
        rng = np.random.default_rng(args.seed)
        for repeat in range(args.repeats):
            measurements += await _measure_repeat(args, preset, pool, bench, policies, plan, repeat, rng, log)
    return advice, measurements


async def _measure_repeat(
    args, preset: str, pool, bench, policies: dict, plan: list, repeat: int, rng, log
) -> list[dict]:
    """One repeat of every (policy, clips, row) of the preset, in a shuffled order (INTERLEAVE)."""
    iterations = _advise_config(args, preset, max(args.clips)).iterations
    turns = iterations if args.interleave == "iteration" else 1
    runs: dict[int, list] = {j: [] for j in range(len(plan))}
    spent = dict.fromkeys(range(len(plan)), 0.0)
    for turn in range(turns):
        for j in rng.permutation(len(plan)):
            policy, clips, row = plan[j]
            hidden, weights = policies[policy]
            seed_ = args.seed + repeat + args.repeats * turn  # turn 0 the seed a run-interleaved repeat takes
            started = time.perf_counter()
            cfg = _advise_config(args, preset, clips)
            runner = runner_for(pool, hidden, weights, seed_)
            runs[j].append(await run_row(cfg, bench, pool, runner, row, clips, seed_, iterations=iterations // turns))
            spent[j] += time.perf_counter() - started
    measurements = []
    for j, (policy, clips, row) in enumerate(plan):
        summary = runs_summary(runs[j], pool)
        measurements.append(
            {
                "preset": preset,
                "policy": policy,
                "clips": clips,
                "mode": mode_label(row["settings"]),
                "variant": row["label"],
                "repeat": repeat,
                "effective_throughput": float(summary["effective_throughput"]),
                "validity": float(summary["validity"]),
                "slot_resets_per_1k_valid": float(summary["slot_resets_per_1k_valid"]),
                "limit": float(summary["limit"]),
                "step_calls_per_valid": float(summary["step_calls_per_valid"]),
                "step_latency_s": float(summary["step_latency_s"]),
                "time_split_s": summary["time_split_s"],
                "seconds": spent[j],
            }
        )
        log(
            f"{preset} {policy} clips={clips} {row['label']} repeat {repeat + 1}/{args.repeats}: "
            f"{summary['effective_throughput']:,.0f} valid/s, predicted {row['effective_throughput']:,.0f}/s "
            f"({spent[j]:.1f} s)"
        )
    return measurements


def run(args: argparse.Namespace, log=None) -> dict:
    log = log or (lambda text: print(text, flush=True))
    started = time.perf_counter()
    advice, measurements = [], []
    for preset in args.presets:
        a, m = asyncio.run(_run_preset(args, preset, log))
        advice += a
        measurements += m
    config = {**vars(args), "checkpoint": str(args.checkpoint) if args.checkpoint else None, "out": str(args.out)}
    return {
        "config": config,
        "wall_clock_s": time.perf_counter() - started,
        "advice": advice,
        "measurements": measurements,
        "summary": summarise(advice, measurements),
    }


def _servers(text: str) -> int:
    value = count(text)
    if value > 64:
        raise argparse.ArgumentTypeError(f"{text!r}: give at most 64 (fast advise's bound)")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for ranking.json and ranking.md")
    p.add_argument("--presets", type=names(PRESETS), default=list(PRESETS), help="cost presets, comma-separated")
    p.add_argument("--clips", type=counts, default=list(CLIPS), help="clip counts, comma-separated")
    p.add_argument("--checkpoint", type=checkpoint, default=None, help="a fast train run's checkpoints: adds 'trained'")
    p.add_argument("--repeats", type=count, default=2, help="measurements of each row (median)")
    p.add_argument(
        "--samples",
        type=count,
        default=None,
        help=f"valid transitions of an iteration, as predicted and measured (`fast advise`'s default: "
        f"{SAMPLES_PER_10_CLIPS} per 10 clips, rounded up)",
    )
    p.add_argument(
        "--iterations",
        type=count,
        default=None,
        help=f"measured iterations of a row, as predicted and measured (`fast advise`'s default: "
        f"{AdviseConfig.model_fields['iterations'].default})",
    )
    p.add_argument(
        "--interleave",
        choices=INTERLEAVE,
        default="iteration",
        help="what a repeat shuffles: each row's iterations one at a time, every row's turn before any row's "
        "next (iteration), or each row's whole run (run, as before 2026-12-07)",
    )
    p.add_argument("--servers", type=_servers, default=2, help="sim-server processes per preset")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument(
        "--model-seeds",
        type=count,
        default=None,
        help=f"seeds each prediction is played on (fast advise's --model-seeds, default "
        f"{AdviseConfig.model_fields['model_seeds'].default}); with --repredict, in place of those the run recorded",
    )
    p.add_argument(
        "--rescore",
        type=_ranking_json,
        default=None,
        help="a ranking.json already measured: its verdicts recomputed with this version's rules into --out, "
        "nothing measured (the other options are ignored)",
    )
    p.add_argument(
        "--repredict",
        type=_ranking_json,
        default=None,
        help="a ranking.json already measured (with its model inputs): every row it measured predicted again by "
        "this version's model on the inputs its probe recorded, and the verdicts recomputed into --out, "
        "nothing measured (the other options are ignored)",
    )
    return p


def _ranking_json(text: str) -> dict:
    path = Path(text)
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise argparse.ArgumentTypeError(
            f"{text[:200]!r}: not a readable ranking.json ({type(exc).__name__})"
        ) from None
    if not isinstance(result, dict) or not {"config", "advice", "measurements"} <= set(result):
        raise argparse.ArgumentTypeError(
            f"{text[:200]!r}: give a ranking.json this benchmark wrote (config, advice, measurements)"
        )
    return {**result, "rescored_from": str(path)}


def rescore(result: dict) -> dict:
    """A measured result's verdicts recomputed from its advice and measurements."""
    return {**result, "summary": json_safe(summarise(result["advice"], result["measurements"]))}


def repredict(result: dict, seeds: int | None = None) -> dict:
    """A measured result with every row's prediction made again by this version's model, on the
    workload, horizon and seed its probe recorded, for the variant it measured (its settings, alpha
    included: the measurement is of that variant, whatever this model would now pick); the figures
    the run itself predicted are kept as `recorded_effective_throughput`. `seeds`, when given, in
    place of the seeds the run played each prediction on (1 where it recorded none)."""
    advice = []
    for a in result["advice"]:
        inputs = a.get("model_inputs")
        if inputs is None:
            raise ValueError(
                f"{a['preset']} {a['policy']} clips={a['clips']}: no model_inputs (measured before they were "
                "recorded, 2026-12-06): measure it again, or use --rescore"
            )
        workload, horizon, seed, recorded_seeds = inputs_from_record(inputs)
        rows = []
        for row in a["rows"]:
            p = predict(workload, ModeSettings(**row["settings"]), horizon, seed=seed, seeds=seeds or recorded_seeds)
            recorded = row.get("recorded_effective_throughput", row["effective_throughput"])
            rows.append({**row, **p.as_dict(), "recorded_effective_throughput": recorded})
        advice.append({**a, "rows": rows})
    return {
        **result,
        "advice": advice,
        "repredicted": True,
        "repredicted_seeds": seeds,
        "summary": json_safe(summarise(advice, result["measurements"])),
    }


def main(argv: list[str] | None = None) -> dict:
    options = parser()
    args = options.parse_args(argv)
    if args.rescore and args.repredict:
        options.error("give --rescore or --repredict, not both")
    if args.repredict:
        try:
            result = json_safe(repredict(args.repredict, args.model_seeds))
        except ValueError as exc:  # a run measured without its inputs, or inputs this model cannot read
            options.error(f"argument --repredict: {str(exc)[:300]}")
    elif args.rescore:
        result = rescore(args.rescore)
    else:
        result = json_safe(run(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ranking.json").write_text(json.dumps(result, indent=1))
    text = report(result)
    (args.out / "ranking.md").write_text(text)
    print(text)
    return result


if __name__ == "__main__":
    main()

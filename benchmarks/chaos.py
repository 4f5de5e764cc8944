"""Chaos: one `fast`-mode training run on the local stack while its processes are killed, frozen and lied to.

    python benchmarks/chaos.py                       # the committed run -> benchmarks/results/chaos/
    python benchmarks/chaos.py --iterations 8 --kills 2 --stops 1 --garbage-s 2 --no-baseline --out /tmp/chaos

`python -m benchmarks.chaos [flags]`, from the repository root, is the same command. The parts, one
job each: benchmarks/chaos_plan.py (the settings and the seeded fault schedule), chaos_proxies.py
(the proxies and what they record), chaos_stack.py (the processes, the faults injected, one run),
chaos_analysis.py (the checks below) and chaos_report.py (chaos.md, chaos.json, the log); this file
runs the baseline and the chaos run and writes the results.

The stack is what `fast train` starts, as real processes on loopback with a run token of the
benchmark's own (jobs/tokens.py): S simulator servers (takeover), the learner, the broker. Between
them sit small grpc.aio proxies (chaos_proxies.py), one in front of each simulator server and one in
front of the learner, that forward every call as it is (the token included) and record what went
through. The broker knows only the proxies' addresses.

During the run, on a seeded schedule (each fault fires once the learner has accepted a drawn number
of batches, plus a drawn delay, so that every fault lands inside the run whatever its speed):

- `sim-kill`: a simulator server is SIGKILLed, its proxy closed with it (the broker's connections
  drop and the port refuses, as after a real crash), and both restarted on their old ports;
- `sim-stop`: a simulator server is SIGSTOPped for longer than the broker's step deadline (and
  its reset deadline: whatever call is in flight times out), then SIGCONTed (its connections stay
  open; calls just go unanswered);
- `garbage`: for a window, the proxy of one simulator corrupts some of its real Step answers
  (an observation of the wrong shape, a NaN reward, a slot both terminated and truncated), never
  more than `max_bad_answers - 1` in a row so that the broker faults the simulator but keeps it
  (dropping after too many in a row is tests/test_broker_answers.py's);
- `learner-kill`: the learner is SIGKILLed while it serves a SubmitBatch (its proxy closed with
  it) and restarted on its port; it resumes from its newest checkpoint, the broker waits for it
  (bounded by learner_wait_s) and must send the same batch again.

Simulator faults may overlap; the learner's kill overlaps none (see Injector). The baseline runs
through the same proxies. The PPO update is kept light (2 epochs of 4 minibatches): this measures
the wire and the fault handling, not learning.

What is checked, from the proxies' records alone:

- corruption: every simulator answer delivered intact adds, per slot, the key
  hash(observation the slot held before the step, reward, terminated); a corrupted answer adds
  its real keys to a `spoiled` set instead. Every valid transition of every batch the broker
  submits must have its (observation, reward, terminated) among the produced keys, none among the
  spoiled ones, and no value that is not finite, nor terminated together with truncated;
- batches: each SubmitBatch (by content digest) accepted, refused as stale, or failed in transport
  and sent again; the learner's final version against the batches it acknowledged;
- versions: the versions of the accepted batches, the `policy_version` of metrics.jsonl and the
  learner's checkpoint files (one per version, checkpoint_every 1) must each be 0, 1, ..., n-1;
- hangs: the longest gap without a valid simulator step or an accepted batch, against the stall
  timeout (against learner_wait_s while the learner is down: the broker then waits by design);
- recovery: from each fault to that simulator's first good Step answer (the learner's first
  answer), per fault kind;
- throughput: valid transitions learnt per second against the same run, same seed and settings,
  without faults (through the same proxies), run first in this script.

checkpoint_every is 1: with K > 1 a killed learner resumes up to K-1 versions back and those
versions are trained again, by design (docs/learner.md); this benchmark wants to see whether
anything is lost or repeated beyond that design.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.chaos_plan import ChaosConfig, make_plan  # noqa: E402
from benchmarks.chaos_report import context, json_default, markdown, notes_for, print_run  # noqa: E402
from benchmarks.chaos_stack import run_once  # noqa: E402
from jobs.tokens import temporary_job_token  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "chaos"


async def main_async(cfg: ChaosConfig, out: Path | None, command: str, log) -> dict:
    started = time.monotonic()
    ctx = context()
    ctx["load_average_start"] = ctx.pop("load_average")
    plan = make_plan(cfg)
    kinds = {k: sum(1 for f in plan if f.kind == k) for k in ("sim-kill", "sim-stop", "garbage", "learner-kill")}
    log(f"chaos benchmark: {ctx['cores']} cores, load {ctx['load_average_start'][0]:.1f}; plan {kinds}")
    runs = {}
    work = Path(tempfile.mkdtemp(prefix="fast-chaos-"))
    try:
        with temporary_job_token() as token:
            if cfg.baseline:
                runs["baseline"] = await run_once(cfg, [], "baseline", work / "baseline", token, log)
                print_run(runs["baseline"], log)
            runs["chaos"] = await run_once(cfg, plan, "chaos", work / "chaos", token, log)
            print_run(runs["chaos"], log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ctx["load_average_end"] = os.getloadavg()
    result = {
        "command": command,
        "config": asdict(cfg),
        "plan": [asdict(f) for f in plan],
        "context": ctx,
        "wall_clock_s": time.monotonic() - started,
        "runs": runs,
    }
    base, chaos = runs.get("baseline"), runs["chaos"]
    if base and base["valid_per_s"] and chaos["valid_per_s"]:
        result["throughput_ratio"] = chaos["valid_per_s"] / base["valid_per_s"]
        log(f"throughput with faults / without: {result['throughput_ratio']:.2f}")
    result["notes"] = notes_for(result)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "chaos.json").write_text(json.dumps(result, indent=1, default=json_default))
        (out / "chaos.md").write_text(markdown(result))
        log(f"wrote {out / 'chaos.json'} and {out / 'chaos.md'}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = ChaosConfig()
    for name in ("iterations", "samples", "servers", "slots", "seed", "kills", "stops", "learner_kills"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    for name in ("garbage_s", "step_timeout_s", "stall_timeout_s", "run_timeout_s"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, default=getattr(defaults, name))
    parser.add_argument("--preset", default=defaults.preset, choices=("off", "step-only"))
    parser.add_argument("--no-baseline", action="store_true", help="skip the run without faults")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    values = {k: v for k, v in vars(args).items() if k not in ("no_baseline", "out")}
    cfg = ChaosConfig(**values, baseline=not args.no_baseline)
    lines: list[str] = []

    def log(message: str) -> None:
        print(message, flush=True)
        lines.append(message)

    command = "python benchmarks/chaos.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result = asyncio.run(main_async(cfg, args.out, command.strip(), log))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "run.log").write_text("\n".join(lines) + "\n")
    return 0 if all(result["runs"]["chaos"]["verdict"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())

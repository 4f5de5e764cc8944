"""`fast advise`'s result as text: what was measured, the ranked table, the recommendation, and the
validation of the best rows (measured beside predicted)."""

from __future__ import annotations

import json
import math

from jobs.advise.run import json_safe


def _rate(value: float | None) -> str:
    return f"{value:,.0f}/s" if value is not None and math.isfinite(value) else "-"


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.2f} ms"


def _share(share: float | None) -> str:
    """A probe's compute share; a record made before it was probed has none."""
    return "?" if share is None else f"{100 * share:.0f}%"


def _receive(seconds: float | None) -> str:
    return "a call's receive not measured (no selector loop)" if seconds is None else f"{_ms(seconds)} a call's receive"


def text(result: dict) -> str:
    w = result["workload"]
    where = (
        f"external simulators {','.join(result['workload']['simulators']['specs'])}"
        if "specs" in w["simulators"]
        else f"the built-in takeover workload, preset {w['simulators']['preset']}"
    )
    lines = [
        f"fast advise on {where}: {len(w['servers'])} server(s), {w['clips']} clips, the {w['policy']} policy",
        "",
        "measured (medians):",
    ]
    for server, probe in result["probes"].items():
        c, f = probe["costs"], probe["findings"]
        yes = [name for name, found in f.items() if found]
        lines.append(
            f"  server {server}: step {_ms(c['step_s'])} + {_ms(c['step_per_slot_s'])}/slot, reset fixed "
            f"{_ms(c['reset_fixed_s'])} + {_ms(c['reset_per_slot_s'])}/slot, map load {_ms(c['map_load_s'])}, "
            f"call {_ms(probe['call_s'])}; compute {_share(c.get('step_compute_share'))} of a step, "
            f"{_share(c.get('reset_compute_share'))} of a reset; {', '.join(yes) if yes else 'no finding'}"
        )
    inference, lengths = result["inference"], result["episode_lengths"]
    p10, p50, p90 = lengths["p10_p50_p90"]
    lines += [
        f"  forward pass {_ms(inference['inference_s'])} + {_ms(inference['inference_per_obs_s'])}/observation; "
        f"the broker's part of a call {_ms(result['call_s']['used'])} (a lock-step row's, its thread's CPU "
        f"{_ms(result['row_cpu_s'])} of it, {_receive(result['call_receive_cpu_s'])}; "
        f"one call alone {_ms(result['call_s']['one_call'])}); "
        f"VER's own work {1e6 * result['ver']['slot_s']:.0f} us/slot-step",
        f"  episode lengths (Kaplan-Meier): mean {lengths['mean']:.1f}, p10/p50/p90 {p10}/{p50}/{p90}, "
        f"longest seen {lengths['longest']}",
        f"  FAST's alpha: {result['alpha']['best']:g} (best of {len(result['alpha']['grid'])} on the model)",
        "",
        "predicted, best first:",
        f"  {'mode':<30} {'effective':>11} {'eta':>6} {'resets/1k':>10} {'limit':>11}  binding",
    ]
    for row in result["ranking"]:
        lines.append(
            f"  {row['label']:<30} {_rate(row['effective_throughput']):>11} {row['eta']:>6.3f} "
            f"{row['slot_resets_per_1k_valid']:>10.1f} {_rate(row['limit']):>11}  {row['limit_binding']}"
        )
    r = result["recommended"]
    extra = f", alpha {r['alpha']:g}, t_max {r['t_max']}, truncation {r['truncation']}" if r["mode"] == "fast" else ""
    lines += [
        "",
        f"recommended: --mode {r['mode']}{extra}, prefetch {'on' if r['prefetch'] else 'off'}, "
        f"locality {'on' if r['locality'] else 'off'}",
        f"  ({r['label']}: {r['reason']})",
    ]
    if result["validation"]:
        lines += ["", "validated (the real samplers, briefly):"]
        lines.append(f"  {'mode':<30} {'predicted':>11} {'measured':>11} {'ratio':>6}")
        for v in result["validation"]:
            lines.append(
                f"  {v['label']:<30} {_rate(v['predicted_effective_throughput']):>11} "
                f"{_rate(v['measured_effective_throughput']):>11} {v['ratio']:>6.2f}"
            )
    t = result["timings_s"]
    lines += [
        "",
        f"took {result['wall_s']:.1f} s (probe {t['probe']:.1f} s, episode lengths {t['lengths']:.1f} s, "
        f"model {t['predict']:.1f} s, validation {t['validate']:.1f} s)",
    ]
    return "\n".join(lines)


def as_json(result: dict) -> str:
    return json.dumps(json_safe(result), indent=1)

"""The limit a simulator's costs put on a sampling pattern, printed beside every sampling result.

A measured throughput says little until it is set against what the simulators could give. Each
bound below is an upper bound on effective throughput (valid transitions a second) that no
scheduler can beat with the *pattern* a row measured: its validity eta (the share of slot-steps
that are not padding), its slot resets and Reset calls per valid transition, and the map cache's
hit rate on those resets. The lowest bound holds and names the limit.

- **step**: every slot steps once per step latency, and only a share eta of those steps count:
  `eta * slots / step_latency`. The latency is the one really paid (the servers' compute plus
  emulated wait per Step call, as they report it), not the configured one.
- **load** (a shared load channel per server, `map_load_shared`): each server loads one map at a
  time, so the servers load at most `servers / map_load_s` maps a second, and the pattern needs
  `resets_per_valid * (1 - hit_rate)` loads per valid transition (a cached map costing
  `map_load_cached_s` instead, 0 in the presets).
- **engine** (an exclusive reset engine, `reset_fixed_exclusive`): each Reset call holds the
  server's engine for `reset_fixed_s`: `servers / (reset_calls_per_valid * reset_fixed_s)`.
- **step+engine** (that engine stops the server's steps, `reset_blocks_steps`, the `vectorized`
  preset): a server steps only outside its fixed parts, so the step and engine times add up
  instead of overlapping: `1 / (step_latency / (eta * slots) + reset_calls_per_valid *
  reset_fixed_s / servers)`, i.e. `1 / (1/step + 1/engine)`, below both. It takes the slots as
  spread evenly over the servers (as the benchmark spreads them). Without an exclusive engine
  the fixed parts of a server may overlap one another, so the time they stop its steps is not
  their sum, and no bound is drawn from it (the slot bound below still holds).
- **slot** (resets that queue for nothing, the `parallel` preset): a slot cannot step while it
  resets, so each slot's valid transition costs `step_latency / eta` plus its share of the
  resets: `slots / (step_latency / eta + resets_per_valid * (reset_fixed_s + (1 - hit_rate) * map_load_s))`.

The bounds take the pattern as given: a mode that pads more, cuts more episodes or misses the
cache more has a lower limit of its own. So the report also gives each mode's share of the best
limit among the modes of its configuration (same preset, clips and policy).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Costs:
    """The emulated costs that bound a pattern (seconds), from the servers' Describe."""

    reset_fixed_s: float = 0.0
    reset_fixed_exclusive: bool = True
    map_load_s: float = 0.0
    map_load_cached_s: float = 0.0
    map_load_shared: bool = True
    reset_blocks_steps: bool = False

    def load_s(self, hit_rate: float) -> float:
        """Mean load time of one reset slot at this cache hit rate."""
        return (1.0 - hit_rate) * self.map_load_s + hit_rate * self.map_load_cached_s


@dataclass(frozen=True)
class Pattern:
    """What a measured iteration did, per valid transition where it is a rate."""

    slots: int
    servers: int  # the servers those slots are spread over
    step_latency_s: float  # mean server time of a Step call (compute + emulated), as measured
    eta: float  # valid transitions / all slot-steps
    resets_per_valid: float  # slot resets / valid transitions
    reset_calls_per_valid: float  # Reset calls / valid transitions
    hit_rate: float  # reset slots whose map was cached / reset slots (0 when the servers do not count)

    @classmethod
    def from_calls(cls, calls: Mapping[str, float], *, slots: int, servers: int, eta: float, valid: int) -> Pattern:
        """An iteration's pattern from its simulator calls (the pool's counters, as a metrics line's
        `pool_calls` records them) and its valid transitions (> 0)."""
        counted = calls["map_loads"] + calls["map_cache_hits"]
        return cls(
            slots=slots,
            servers=servers,
            step_latency_s=calls["step_server_s"] / calls["step_calls"] if calls["step_calls"] else 0.0,
            eta=eta,
            resets_per_valid=calls["reset_slots"] / valid,
            reset_calls_per_valid=calls["reset_calls"] / valid,
            hit_rate=calls["map_cache_hits"] / counted if counted else 0.0,
        )


@dataclass(frozen=True)
class Limit:
    bounds: dict[str, float]  # name -> valid transitions a second; inf where a cost is 0
    limit: float  # the lowest bound
    binding: str  # its name

    def as_row(self) -> dict:
        return {"limit": self.limit, "limit_binding": self.binding, "limit_bounds": dict(self.bounds)}


def pattern_limit(costs: Costs, pattern: Pattern) -> Limit:
    p = pattern
    bounds: dict[str, float] = {}
    bounds["step"] = p.eta * p.slots / p.step_latency_s if p.step_latency_s > 0 else math.inf
    if costs.map_load_shared:
        seconds = p.resets_per_valid * costs.load_s(p.hit_rate)
        bounds["load"] = p.servers / seconds if seconds > 0 else math.inf
    if costs.reset_fixed_exclusive:
        seconds = p.reset_calls_per_valid * costs.reset_fixed_s
        bounds["engine"] = p.servers / seconds if seconds > 0 else math.inf
        if costs.reset_blocks_steps and p.eta > 0:
            # Wall seconds per valid transition: stepping (all slots at once), then fixed parts (all servers).
            seconds = p.step_latency_s / (p.eta * p.slots) + seconds / p.servers
            bounds["step+engine"] = 1.0 / seconds if seconds > 0 else math.inf
    # A slot is busy while it resets, whatever queues: its own reset time adds to its stepping. Where
    # the resets queue (shared channel, exclusive engine) the queues are the bounds above instead.
    own_reset_s = (0.0 if costs.reset_fixed_exclusive else costs.reset_fixed_s) + (
        0.0 if costs.map_load_shared else costs.load_s(p.hit_rate)
    )
    if own_reset_s > 0 and p.step_latency_s > 0 and p.eta > 0:
        bounds["slot"] = p.slots / (p.step_latency_s / p.eta + p.resets_per_valid * own_reset_s)
    binding = min(bounds, key=bounds.__getitem__)
    return Limit(bounds, bounds[binding], binding)


def costs_from_describe(cost_model) -> Costs:
    """Costs from a Describe's CostModel message (or anything with its field names); zeros for None."""
    if cost_model is None:
        return Costs(map_load_shared=False, reset_fixed_exclusive=False)
    return Costs(
        reset_fixed_s=float(cost_model.reset_fixed_s),
        reset_fixed_exclusive=bool(cost_model.reset_fixed_exclusive),
        map_load_s=float(cost_model.map_load_s),
        map_load_cached_s=float(cost_model.map_load_cached_s),
        map_load_shared=bool(cost_model.map_load_shared),
        reset_blocks_steps=bool(cost_model.reset_blocks_steps),
    )


def costs_as_dict(costs: Costs) -> dict:
    return asdict(costs)


# The counts of a metrics line's `pool_calls` that `line_limit` reads.
_POOL_CALLS = ("step_calls", "step_server_s", "reset_calls", "reset_slots", "map_loads", "map_cache_hits")


def line_limit(line: dict, costs: Costs, servers: int) -> Limit | None:
    """The limit on the pattern one iteration of a run sampled, from its metrics.jsonl line (the
    broker's `pool_calls`: Step calls and the server time they took, Reset calls and slots, map
    loads and cache hits) and the servers' costs, as `fast bench sampling` draws it for a row.
    None for a line without `pool_calls` (a run before they were recorded), with one that lacks a
    count or holds a non-number (a line edited by hand: it counts as an older one, and the report is
    still written), or without a valid step."""
    calls, valid = line.get("pool_calls"), line.get("valid_transitions")
    if not isinstance(calls, dict) or not all(isinstance(calls.get(k), int | float) for k in _POOL_CALLS):
        return None
    if not isinstance(valid, int) or valid <= 0 or not calls["step_calls"]:
        return None
    if not isinstance(line.get("num_slots"), int) or not isinstance(line.get("validity"), int | float):
        return None
    pattern = Pattern.from_calls(
        calls, slots=int(line["num_slots"]), servers=servers, eta=float(line["validity"]), valid=valid
    )
    return pattern_limit(costs, pattern)


def least_sampling(lines: list[dict], costs: Costs, servers: int) -> dict:
    """A run's sampling seconds (every iteration's, updates apart) beside the least its simulators'
    costs allow the patterns it sampled: the sum over iterations of valid transitions / that
    iteration's limit (`line_limit`), with the bound that binds most often. Iterations whose line
    has no `pool_calls` count in neither sum (`limited_iterations` says how many did)."""
    sampling_s = limit_s = 0.0
    bindings: Counter[str] = Counter()
    for line in lines:
        limit = line_limit(line, costs, servers)
        if limit is None or not math.isfinite(limit.limit) or limit.limit <= 0:
            continue
        sampling_s += float(line["sampling_time_s"])
        limit_s += line["valid_transitions"] / limit.limit
        bindings[limit.binding] += 1
    return {
        "sampling_s": sampling_s,
        "limit_sampling_s": limit_s,
        "limit_binding": bindings.most_common(1)[0][0] if bindings else None,
        "limited_iterations": sum(bindings.values()),
        "iterations": len(lines),
    }

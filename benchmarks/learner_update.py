"""Time of one SMPO-PPO update on a realistic batch, padded as DPSA pads it and compacted.

    python benchmarks/learner_update.py [--steps 256] [--slots 10] [--padding 0.2] [--repeats 7] [--device cuda]
    python -m benchmarks.learner_update [the same flags]   # the same command, from the repository root

The batch: N slots of the takeover workload (its observation size, Box(2) actions), each slot
holding the same number K of valid transitions in episodes of geometric length (mean 35,
the article's mean episode length), terminated at their ends, the last one truncated. The
padded form inserts DPSA padding after terminations so that a fraction `--padding` of the
[T, N] grid is invalid; the compacted form is the same transitions as [K, N] with no padding
at all. By SMPO both give the same update (docs/smpo.md), so the difference in time is what
padding costs the learner. Both start on the CPU, as a batch decoded from the wire does, so
the time includes the copy to the device. PPO: defaults but 4 epochs of 4 minibatches.
Repeats are interleaved (padded, compacted, padded, ...) after one warm-up of each, each on
a fresh copy of the same initial learner; the median is printed.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from learner.batch import RolloutBatch  # noqa: E402
from learner.device import pick_device  # noqa: E402
from learner.policy import ActionSpec, ActorCritic  # noqa: E402
from learner.ppo import PPOConfig, PPOLearner  # noqa: E402

MEAN_EPISODE_LENGTH = 35


def takeover_obs_dim() -> int:
    from sim_server.environments import make_env

    return int(np.prod(make_env("takeover", 1, seed=0).observation_space.shape))


def make_batches(steps: int, slots: int, obs_dim: int, padding: float, seed: int) -> tuple[RolloutBatch, RolloutBatch]:
    """(padded [steps, slots], compacted [K, slots]) holding the same valid transitions."""
    rng = np.random.default_rng(seed)
    pad_per_slot = int(round(padding * steps))
    valid_per_slot = steps - pad_per_slot
    shape = (valid_per_slot, slots)
    compact = {
        "obs": rng.normal(size=(*shape, obs_dim)).astype(np.float32),
        "actions": rng.normal(size=(*shape, 2)).astype(np.float32),
        "logprobs": (rng.normal(size=shape) - 2.0).astype(np.float32),
        "values": rng.normal(size=shape).astype(np.float32),
        "rewards": rng.normal(size=shape).astype(np.float32),
        "bootstrap_values": rng.normal(size=shape).astype(np.float32),
        "terminated": rng.random(shape) < 1.0 / MEAN_EPISODE_LENGTH,
        "truncated": np.zeros(shape, bool),
        "valid_mask": np.ones(shape, bool),
    }
    compact["truncated"][-1] = ~compact["terminated"][-1]  # the rollout ends every live episode

    padded = {name: np.empty((steps, slots, *a.shape[2:]), a.dtype) for name, a in compact.items()}
    for slot in range(slots):
        # DPSA pads a slot after its episode terminated, until the round's global reset:
        # spread this slot's padding over the steps right after its terminations.
        ends = np.flatnonzero(compact["terminated"][:, slot])
        ends = ends if ends.size else np.array([valid_per_slot - 1])
        pads = np.bincount(rng.integers(0, ends.size, size=pad_per_slot), minlength=ends.size)
        row, start = 0, 0
        for end, pad in zip(ends, pads):
            for name, array in compact.items():
                padded[name][row : row + end + 1 - start, slot] = array[start : end + 1, slot]
            row += end + 1 - start
            for name in padded:
                padded[name][row : row + pad, slot] = np.nan if padded[name].dtype.kind == "f" else False
            row += pad
            start = end + 1
        for name, array in compact.items():  # after the last termination: the truncated tail
            padded[name][row : row + valid_per_slot - start, slot] = array[start:, slot]
        assert row + valid_per_slot - start == steps
    return (
        RolloutBatch.from_numpy({**padded, "policy_version": 0}),
        RolloutBatch.from_numpy({**compact, "policy_version": 0}),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=256, help="T of the padded batch")
    parser.add_argument("--slots", type=int, default=10, help="N")
    parser.add_argument("--obs-dim", type=int, default=None, help="default: the takeover workload's")
    parser.add_argument("--padding", type=float, default=0.2, help="fraction of the padded grid that is invalid")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default=None, help="default: CUDA when present, else CPU")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    device = pick_device(args.device)
    obs_dim = args.obs_dim or takeover_obs_dim()
    padded, compacted = make_batches(args.steps, args.slots, obs_dim, args.padding, args.seed)
    config = PPOConfig(update_epochs=4, num_minibatches=4)
    torch.manual_seed(args.seed)
    initial = ActorCritic(obs_dim, ActionSpec.box(2))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    print(f"device {device} [{name}], torch {torch.__version__}")
    print(
        f"padded batch [T={padded.num_steps}, N={padded.num_slots}] obs {obs_dim}, valid {padded.num_valid}/"
        f"{padded.num_total} ({padded.num_valid / padded.num_total:.1%}); compacted [K={compacted.num_steps}, "
        f"N={compacted.num_slots}]; PPO {config.update_epochs} epochs x {config.num_minibatches} minibatches"
    )

    times: dict[str, list[float]] = {"padded": [], "compacted": []}
    stats: dict[str, dict] = {}
    for repeat in range(args.repeats + 1):  # repeat 0 warms up (allocator, kernels, threads)
        for label, batch in (("padded", padded), ("compacted", compacted)):
            learner = PPOLearner(copy.deepcopy(initial), config, device=device)
            stats[label] = learner.update(batch)
            if repeat > 0:
                times[label].append(stats[label]["update_time_s"])

    # Same transitions, same shuffles: the SMPO guarantee, checked loosely (float32, other GAE layout).
    assert abs(stats["padded"]["value_loss"] - stats["compacted"]["value_loss"]) <= 1e-3 * (
        1 + abs(stats["compacted"]["value_loss"])
    )
    print(f"{'batch':<10} {'median s':>9} {'min s':>8} {'max s':>8} {'valid trans/s':>14} {'all trans/s':>12}")
    for label, batch in (("padded", padded), ("compacted", compacted)):
        median = statistics.median(times[label])
        print(
            f"{label:<10} {median:>9.4f} {min(times[label]):>8.4f} {max(times[label]):>8.4f} "
            f"{batch.num_valid / median:>14,.0f} {batch.num_total / median:>12,.0f}"
        )
    ratio = statistics.median(times["padded"]) / statistics.median(times["compacted"])
    print(f"padded / compacted update time: {ratio:.3f}")


if __name__ == "__main__":
    main()

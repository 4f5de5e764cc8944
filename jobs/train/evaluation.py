"""The end-of-run evaluation of `fast train`: the final policy against the initial one (version 0,
before any update) and a random one, on held-out clips.

The initial policy is captured before the broker starts: `fast train` initialises the learner
itself (the broker's own Initialize is then a no-op) and keeps version 0's weights in memory.

The final policy is fetched from the learner while it still runs (exactly the last version);
if the learner cannot answer, the newest checkpoint in the run's checkpoint directory is used
instead and eval.json says so. Both policies play the same (clip, seed) episodes on the run's
own simulator servers (broker/evaluate.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from broker.dealer import holdout_clips
from broker.evaluate import EvaluationSession, summarize
from fast.rpc import Credentials
from learner.client import LearnerClient

log = logging.getLogger("jobs.train")


@dataclass(frozen=True)
class FinalPolicy:
    version: int
    hidden_sizes: tuple[int, ...]
    weights: bytes  # learner.policy.export_weights bytes
    source: str  # "learner" or the checkpoint's path


def holdout_note(num_clips: int, holdout_every: int) -> str:
    """ "" when a catalog of `num_clips` clips has held-out clips to evaluate on; else why there are none."""
    if holdout_clips(num_clips, holdout_every).size:
        return ""
    return (
        f"the simulators have {num_clips} clip(s), and the held-out split (clip c with c % {holdout_every} == "
        f"{holdout_every - 1}) needs at least {holdout_every}: no clip is held out, every clip was used for "
        "training, so there is nothing to evaluate on"
    )


async def capture_initial_policy(
    simulator_address: str, learner_address: str, credentials: Credentials | None = None
) -> FinalPolicy:
    """Initialise the learner with the simulator's spaces and take its version-0 policy."""
    from sim_server.client import SimulatorClient

    async with SimulatorClient(simulator_address, timeout_s=15.0, credentials=credentials) as simulator:
        description = await simulator.describe()
    async with LearnerClient(learner_address, timeout_s=15.0, credentials=credentials) as learner:
        await learner.initialize(description.observation_space, description.action_space)
        policy = await learner.get_policy()
    return FinalPolicy(policy.version, tuple(policy.hidden_sizes), policy.weights, "learner (before training)")


async def fetch_final_policy(
    learner_address: str, checkpoint_dir: Path, credentials: Credentials | None = None
) -> FinalPolicy:
    """The learner's current policy; its newest checkpoint when the learner does not answer."""
    try:
        async with LearnerClient(learner_address, timeout_s=15.0, credentials=credentials) as learner:
            policy = await learner.get_policy()
        return FinalPolicy(policy.version, tuple(policy.hidden_sizes), policy.weights, "learner")
    except grpc.aio.AioRpcError as exc:
        log.warning(
            "learner %s did not give its policy (%s: %s); using the newest checkpoint",
            learner_address,
            exc.code().name,
            exc.details(),
        )
    # Imported only on this fallback: learner.checkpoint loads torch (seconds of CPU), which `fast train`'s
    # process needs for nothing else (the weights from the learner are bytes, played by the broker's numpy).
    from learner.checkpoint import CheckpointError, load_latest, policy_weights

    try:
        checkpoint = load_latest(checkpoint_dir)
        if checkpoint is None:
            raise RuntimeError(
                f"no final policy to evaluate: the learner is gone and {checkpoint_dir} holds no checkpoint"
            )
        weights = policy_weights(checkpoint)
    except CheckpointError as exc:
        raise RuntimeError(f"no final policy to evaluate: {exc}") from None
    return FinalPolicy(checkpoint.policy_version, checkpoint.hidden_sizes, weights, str(checkpoint.path))


async def evaluate_run(
    simulators: list[str],
    learner_address: str,
    checkpoint_dir: Path,
    *,
    episodes_per_clip: int,
    holdout_every: int,
    seed: int,
    initial: FinalPolicy | None = None,
    credentials: Credentials | None = None,
) -> dict:
    """Evaluate the final, the initial and a random policy on the held-out clips; the content of eval.json.

    `credentials`: the run's token (None: the environment's)."""
    started = time.perf_counter()
    final = await fetch_final_policy(learner_address, checkpoint_dir, credentials)
    async with EvaluationSession.connect(
        simulators,
        holdout_every=holdout_every,
        episodes_per_clip=episodes_per_clip,
        seed=seed,
        credentials=credentials,
    ) as session:
        session.require_clips()
        trained = await session.play(session.policy(final.hidden_sizes, final.version, final.weights))
        random = await session.play(None)
        untrained = None
        if initial is not None:
            untrained = await session.play(session.policy(initial.hidden_sizes, initial.version, initial.weights))
    return {
        "policy_version": final.version,
        "policy_source": final.source,
        "clips": session.clips.tolist(),
        "episodes_per_clip": episodes_per_clip,
        "seed": seed,
        "eval_time_s": time.perf_counter() - started,
        "trained": {"summary": summarize(trained), "episodes": trained},
        "random": {"summary": summarize(random), "episodes": random},
        **(
            {"initial": {"summary": summarize(untrained), "episodes": untrained, "policy_version": initial.version}}
            if untrained is not None
            else {}
        ),
    }

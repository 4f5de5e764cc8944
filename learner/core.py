"""The learner service's logic without transport: spaces, versions, on-policy rule, checkpoints.

`LearnerCore` owns one `PPOLearner` (policy + Adam) and the policy version: 0 after
Initialize, +1 per accepted update, continued across restarts through checkpoints.

On-policy is enforced, not assumed: a batch is accepted only if it was sampled by the current
version; any other version is refused (FAILED_PRECONDITION) and nothing changes.

Concurrency. The asyncio methods are called from the gRPC event loop; the update itself runs
in a worker thread so the loop keeps answering GetStatus, GetPolicy and health checks while
it trains. `_state_lock` serialises everything that reads or writes the learner's state
(updates, checkpoints, Initialize), one at a time; GetPolicy never takes it: it returns the
weights published (serialised once) after the last update, an immutable snapshot, so a
reader never sees weights half-way through an optimiser step nor waits for an update.
ExportPolicy serialises that same snapshot, so it never races an update either.

Hyper-parameters (learning rate, entropy coefficient) are handed over, not pushed: UpdateHyperparameters
replaces the pending values at once (without waiting for an update) and each update takes them
once, as it starts, under `_hyperparameters_lock`. An update in flight therefore finishes with the
values it started with and the next one uses the new values; the same lock keeps the version, the
pending values and "an update has taken its values" consistent for `effective_from_version`.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from fast.quoting import shorten
from fast.spaces import SpaceSpec, describe_space, space_mismatch
from learner import hyperparameters
from learner.batch import RolloutBatch
from learner.checkpoint import (
    Checkpoint,
    CheckpointError,
    describe_checkpoints,
    load_latest,
    prune_checkpoints,
    save_checkpoint,
)
from learner.config import LearnerConfig
from learner.device import pick_device
from learner.distributed import Ranks, state_digest
from learner.errors import LearnerError, failed_precondition, invalid_argument, unavailable
from learner.export import export_policy
from learner.policy import ActionSpec, ActorCritic, export_weights, parameter_count
from learner.ppo import PPOConfig, PPOLearner
from learner.wire import CheckpointInfo, ExportedPolicy, Hyperparameters, LearnerStatus, Policy

log = logging.getLogger("fast.learner")


@dataclass(frozen=True)
class UpdateResult:
    stats: dict[str, float]  # PPOLearner.update's statistics
    policy_version: int  # the version after the update
    policy: Policy  # the updated policy (weights included)
    checkpoint: Path | None  # written after this update (every K versions), else None
    # Some rank's broker asked to pause / stop with this update's batch (one learner: this submit's own
    # request), so every broker of the run pauses / stops after this iteration (broker/group_control.py).
    run_pauses: bool = False
    run_stops: bool = False


@dataclass(frozen=True)
class Requests:
    """What a batch's broker asked besides the update (or, agreed, what any rank's broker asked)."""

    pause: bool = False
    stop: bool = False


# The largest policy Initialize builds (weights; Adam keeps two more copies and the update a
# gradient): far above any MLP over a real observation (84x84x3 pixels at 64 units is 1.4 M),
# far below what would exhaust the machine. Without it one Initialize with a Box of 10^8
# elements (or Discrete(10^12)) would try to allocate it and take the learner down.
MAX_POLICY_PARAMETERS = 1 << 26


def check_spaces(
    observation_space: SpaceSpec, action_space: SpaceSpec, hidden_sizes: tuple[int, ...] = (64, 64)
) -> ActionSpec:
    """Refuse (INVALID_ARGUMENT) spaces the MLP actor-critic cannot serve, or only with a network above
    MAX_POLICY_PARAMETERS; return the action spec. (The wire form itself is checked when the spaces
    decode: fast.spaces.space_from_proto.)"""
    if observation_space.kind != "box" or not observation_space.shape or min(observation_space.shape) < 1:
        raise invalid_argument(
            f"observation_space: expected a BOX with a non-empty shape of positive sizes, got "
            f"{describe_space(observation_space)}; send a DISCRETE observation one-hot encoded as a BOX"
        )
    try:
        action_spec = ActionSpec.coerce(action_space)
    except ValueError as error:
        raise invalid_argument(f"action_space: {error}") from None
    if action_space.kind == "box" and np.dtype(action_space.dtype).kind != "f":
        raise invalid_argument(
            f"action_space: a BOX action needs a float dtype (the policy is Gaussian), got "
            f"{describe_space(action_space)}; use FLOAT32, or a DISCRETE space"
        )
    parameters = parameter_count(tuple(observation_space.shape), action_spec, hidden_sizes)
    if parameters > MAX_POLICY_PARAMETERS:
        raise invalid_argument(
            f"observation_space {describe_space(observation_space)} with action_space "
            f"{describe_space(action_space)} needs a policy of {parameters:,} parameters (hidden sizes "
            f"{list(hidden_sizes)}); the learner builds at most {MAX_POLICY_PARAMETERS:,}: send a smaller "
            "observation (downsample, encode it) or fewer actions"
        )
    return action_spec


def _device_name(device: torch.device) -> str:
    if device.type == "cuda" and device.index is None:
        return f"cuda:{torch.cuda.current_device()}"
    return str(device)


class LearnerCore:
    """Initialize, GetPolicy, SubmitBatch, GetStatus, SaveCheckpoint, UpdateHyperparameters,
    ListCheckpoints and ExportPolicy, minus the wire."""

    def __init__(self, config: LearnerConfig, ranks: Ranks | None = None) -> None:
        """Pick the device and resume from the newest readable checkpoint in config.checkpoint_dir, if any.

        Raises ValueError for an absent requested device, CheckpointError when checkpoints
        exist but none can be restored, or (with `ranks`) when the ranks resumed other versions.

        `ranks`: this learner is one rank of a data-parallel group (learner/group.py joined it). Every
        update waits for the other ranks' batches of the same version and steps with them
        (learner/distributed.py); rank 0 alone writes checkpoints and takes hyper-parameters.
        """
        self.config = config
        self._ranks = ranks
        self._writes_checkpoints = ranks is None or ranks.rank == 0
        self.ppo_config = config.ppo_config()
        self.device = pick_device(config.device)
        self.device_name = _device_name(self.device)
        self._state_lock = threading.Lock()  # guards the learner, the version, checkpoints
        self._counter_lock = threading.Lock()
        # Guards the pending hyper-parameters, `_update_in_flight` and the version's increment (below).
        self._hyperparameters_lock = threading.Lock()
        self._update_in_flight = False  # an update has taken its hyper-parameters and not yet ended
        self._learner: PPOLearner | None = None
        self._spaces: tuple[SpaceSpec, SpaceSpec] | None = None
        self._hidden_sizes = tuple(config.hidden_sizes)
        self._version = 0
        self._published: Policy | None = None
        self._checkpointed_version: int | None = None
        self.updates_this_process = 0
        self.stale_batches_refused = 0
        self.last_stats: dict[str, float] | None = None
        self.last_checkpoint: Path | None = None
        self._configured_hyperparameters = Hyperparameters(learning_rate=config.lr, ent_coef=config.ent_coef)
        # What the next update takes as it starts; replaced whole (never mutated), so a reader needs no lock.
        self._hyperparameters = self._configured_hyperparameters
        self._checkpointed_hyperparameters: Hyperparameters | None = None
        # Set when a collective of the group failed (a rank gone, or no batch within rank_timeout_s): the
        # group is unusable, every later SubmitBatch is UNAVAILABLE, and `on_group_failure` (the server's:
        # stop this process, which exits 1 so that torchrun or the platform restarts the group) is called.
        self.group_failure: str | None = None
        self.on_group_failure: Callable[[], None] | None = None
        restored = load_latest(config.checkpoint_dir)
        if restored is not None:
            self._restore(restored)
        if ranks is not None:
            self._agree_on_resume(ranks)

    # -- queries (event loop, never blocked by an update) ------------------------------------

    @property
    def initialized(self) -> bool:
        return self._published is not None

    @property
    def policy_version(self) -> int:
        return self._version

    def status(self) -> LearnerStatus:
        return LearnerStatus(
            initialized=self.initialized,
            policy_version=self._version,
            device=self.device_name,
            updates_this_process=self.updates_this_process,
            last_stats=self.last_stats,
            last_checkpoint=str(self.last_checkpoint or ""),
            stale_batches_refused=self.stale_batches_refused,
            hyperparameters=self._hyperparameters,
        )

    def get_policy(self, known_version: int = -1) -> Policy:
        """The current policy; weights are left out (b"") when `known_version` is current."""
        snapshot = self._require_initialized("GetPolicy")
        return replace(snapshot, weights=b"") if known_version == snapshot.version else snapshot

    # -- commands --------------------------------------------------------------------------

    async def initialize(self, observation_space: SpaceSpec, action_space: SpaceSpec) -> tuple[int, bool]:
        """Build the policy for these spaces; returns (policy_version, resumed).

        Idempotent: the same spaces again (or those of a restored checkpoint) give
        resumed=True and change nothing; other spaces are refused (FAILED_PRECONDITION).
        """
        return await asyncio.to_thread(self._initialize_blocking, observation_space, action_space)

    async def submit(
        self, batch: RolloutBatch, *, pause_requested: bool = False, stop_requested: bool = False
    ) -> UpdateResult:
        """Run one PPO update on a batch sampled by the current version; bump the version.

        Refuses (FAILED_PRECONDITION) a batch of any other version and (INVALID_ARGUMENT) a
        batch that does not fit the spaces; a refused or failed update changes nothing.
        `pause_requested` / `stop_requested`: this batch's broker was asked to pause / stop; the result's
        run_pauses / run_stops say whether any rank's was (the ranks agree on it with the update), so that
        all brokers pause or stop together.
        """
        self._require_initialized("SubmitBatch")
        # Cheap early refusal on the event loop; the check that counts is repeated under the lock.
        self._refuse_stale(batch.policy_version)
        requests = Requests(pause=pause_requested, stop=stop_requested)
        return await asyncio.to_thread(self._submit_blocking, batch, requests)

    @property
    def world_size(self) -> int:
        """Learner ranks in this learner's group; 1 for a single learner."""
        return 1 if self._ranks is None else self._ranks.world_size

    async def save_checkpoint(self) -> tuple[Path, int]:
        """Write a checkpoint now (after any update in flight); returns (path, policy_version)."""
        self._require_initialized("SaveCheckpoint")
        self._require_rank_zero("SaveCheckpoint", "writes checkpoints")
        return await asyncio.to_thread(self._save_blocking)

    def update_hyperparameters(
        self, *, learning_rate: float | None = None, ent_coef: float | None = None
    ) -> tuple[Hyperparameters, int]:
        """Change the learning rate and/or the entropy coefficient from the next update on; returns (the
        values in force from then on, the first policy version trained with them).

        Never waits for an update: one in flight keeps the values it started with, so the first version
        trained with the new ones is then the one after it (should that update be refused and rolled
        back, they train the version it would have made). Refuses (INVALID_ARGUMENT) a value out of
        range or a call that sets neither. Allowed before Initialize: the values then train the policy
        Initialize builds (and are persisted from its version-0 checkpoint on).
        """
        self._require_rank_zero("UpdateHyperparameters", "takes hyper-parameters (every rank trains with its values)")
        with self._hyperparameters_lock:
            values = hyperparameters.updated(self._hyperparameters, learning_rate=learning_rate, ent_coef=ent_coef)
            self._hyperparameters = values
            effective_from = self._version + 1 + int(self._update_in_flight)
        log.info(
            "hyperparameters from version %d on: learning_rate=%r ent_coef=%r",
            effective_from,
            values.learning_rate,
            values.ent_coef,
        )
        return values, effective_from

    async def list_checkpoints(self) -> list[CheckpointInfo]:
        """The checkpoint files in checkpoint_dir, newest first (any state, before Initialize too)."""
        return await asyncio.to_thread(describe_checkpoints, self.config.checkpoint_dir)

    async def export_policy(self, format_name: str) -> ExportedPolicy:
        """The current policy as a deterministic model (learner/export.py), `format_name` "torchscript" or "onnx".

        Refuses (FAILED_PRECONDITION) before Initialize. Serialises the published snapshot in a
        worker thread, so it neither blocks the event loop nor waits for an update.
        """
        snapshot = self._require_initialized("ExportPolicy")
        model = await asyncio.to_thread(export_policy, snapshot, format_name)
        return ExportedPolicy(
            model=model,
            policy_version=snapshot.version,
            observation_shape=tuple(snapshot.observation_space.shape),
        )

    async def close(self) -> Path | None:
        """The final checkpoint at shutdown, if anything changed since the last one.

        Takes the state lock, so an update still running in its thread (its RPC cancelled
        by the shutdown grace) finishes first and is included.
        """
        return await asyncio.to_thread(self._close_blocking)

    # -- worker-thread bodies (hold the state lock) ----------------------------------------

    def _initialize_blocking(self, observation_space: SpaceSpec, action_space: SpaceSpec) -> tuple[int, bool]:
        action_spec = check_spaces(observation_space, action_space, self._hidden_sizes)
        if self._published is not None:
            # Spaces never change once published: answer without waiting for an update in flight.
            return self._confirm_spaces(observation_space, action_space)
        with self._state_lock:
            if self._spaces is not None:  # set by a concurrent Initialize while we waited
                return self._confirm_spaces(observation_space, action_space)
            with torch.random.fork_rng(devices=[]):
                # Seeded on the CPU, then moved: the same initial weights on every device,
                # without disturbing the process's global RNG.
                torch.manual_seed(self.config.seed)
                policy = ActorCritic(
                    tuple(observation_space.shape),
                    action_spec,
                    self._hidden_sizes,
                    init_log_std=self.config.init_log_std,
                    obs_norm=self.config.obs_norm,
                )
            self._learner = PPOLearner(policy, self._ppo_config_in_force(), device=self.device)
            self._spaces = (observation_space, action_space)
            self._version = 0
            self._publish()
            # A version-0 checkpoint records the spaces: a learner restarted before its first
            # K updates is still initialised, with the same weights, and checks the spaces.
            self._write_checkpoint_logged()
            log.info(
                "initialized: observation %s, action %s, version 0",
                describe_space(observation_space),
                describe_space(action_space),
            )
            return 0, False

    def _confirm_spaces(self, observation_space: SpaceSpec, action_space: SpaceSpec) -> tuple[int, bool]:
        assert self._spaces is not None
        have_obs, have_act = self._spaces
        mismatches = [
            text
            for text in (
                space_mismatch("observation_space", have_obs, observation_space),
                space_mismatch("action_space", have_act, action_space),
            )
            if text
        ]
        if not mismatches:
            return self._version, True
        raise failed_precondition(
            f"Initialize with other spaces than the learner's: {'; '.join(mismatches)} (policy version "
            f"{self._version}, checkpoints in {self.config.checkpoint_dir}); initialize with the learner's spaces, "
            "or start a learner on another --checkpoint-dir for a new run"
        )

    def _submit_blocking(self, batch: RolloutBatch, requests: Requests) -> UpdateResult:
        with self._state_lock:
            # A second submit of the same version waited here while the first one trained;
            # it is stale now and must not be learnt from.
            self._refuse_stale(batch.policy_version)
            if self.group_failure is not None:
                raise unavailable(self.group_failure)
            refusal = None
            try:
                self._check_batch(batch)
            except LearnerError as error:
                if self._ranks is None:
                    raise
                refusal = error  # told to the other ranks first, so that they refuse too
            learner = self._learner
            assert learner is not None
            with self._hyperparameters_lock:
                values = self._hyperparameters  # this update's, whatever UpdateHyperparameters does meanwhile
                self._update_in_flight = True
            stats = None
            try:
                if self._ranks is not None:  # waits for the other ranks
                    values, requests = self._agree_on_update(self._ranks, values, refusal, requests)
                learner.set_hyperparameters(
                    learning_rate=values.learning_rate,
                    ent_coef=values.ent_coef,
                    lr_anneal_factor=self._anneal_factor(),
                )
                stats = self._update_or_roll_back(learner, batch)
            finally:
                with self._hyperparameters_lock:
                    # In one step: UpdateHyperparameters sees (v, in flight) or (v + 1, idle), never a
                    # version that an update which has taken its values is about to leave.
                    if stats is not None:
                        self._version += 1
                    self._update_in_flight = False
            self.updates_this_process += 1
            self.last_stats = stats
            policy = self._publish()
            checkpoint = None
            if self._version % self.config.checkpoint_every == 0:
                checkpoint = self._write_checkpoint_logged()
            return UpdateResult(
                stats=stats,
                policy_version=self._version,
                policy=policy,
                checkpoint=checkpoint,
                run_pauses=requests.pause,
                run_stops=requests.stop,
            )

    def _update_or_roll_back(self, learner: PPOLearner, batch: RolloutBatch) -> dict[str, float]:
        # PPOLearner.update can fail after some minibatch steps (a non-finite gradient);
        # rolling back keeps "a refused batch changes nothing" true.
        backup = copy.deepcopy(learner.state_dict())
        try:
            return learner.update(batch) if self._ranks is None else learner.update(batch, self._ranks)
        except BaseException as error:
            learner.load_state_dict(backup)
            if self._ranks is not None and isinstance(error, RuntimeError):  # torch.distributed's errors
                raise self._group_failed(error) from None
            if isinstance(error, (ValueError, FloatingPointError)):
                raise invalid_argument(
                    f"batch: the update failed and was rolled back, the policy stays at version "
                    f"{self._version}: {error}"
                ) from None
            raise

    def _save_blocking(self) -> tuple[Path, int]:
        with self._state_lock:
            return self._write_checkpoint(), self._version

    def _close_blocking(self) -> Path | None:
        with self._state_lock:
            if self._learner is None or not self._writes_checkpoints:
                return None
            unchanged = (
                self._checkpointed_version == self._version
                and self._checkpointed_hyperparameters == self._hyperparameters
            )
            return None if unchanged else self._write_checkpoint()

    # -- helpers ---------------------------------------------------------------------------

    def _require_initialized(self, call: str) -> Policy:
        snapshot = self._published
        if snapshot is None:
            raise failed_precondition(
                f"{call} before Initialize: the learner has no policy yet; call Initialize with the "
                "simulators' observation and action spaces first"
            )
        return snapshot

    def _require_rank_zero(self, call: str, what: str) -> None:
        if self._ranks is not None and self._ranks.rank != 0:
            raise failed_precondition(
                f"{call} on rank {self._ranks.rank} of {self._ranks.world_size}: rank 0's learner {what}; call it there"
            )

    def _agree_on_update(
        self, ranks: Ranks, values: Hyperparameters, refusal: LearnerError | None, requests: Requests
    ) -> tuple[Hyperparameters, Requests]:
        """Before a group update, every rank tells the others its version, its weights' digest, whether it
        accepts its batch, its hyper-parameters and whether its broker asked to pause or stop. Returns
        rank 0's hyper-parameters, which every rank trains with, and whether any broker asked to pause /
        stop (every rank's broker then pauses / stops after this iteration); raises on every rank alike
        (nothing changes anywhere) when a rank refused its batch or the ranks do not hold the same policy.
        Waits for every rank's batch (rank_timeout_s at most)."""
        assert self._learner is not None
        # 48 bits of the digest: exact in a float64, and a collision would need 2^24 different states.
        digest = int(state_digest(self._learner.policy)[:12], 16)
        try:
            rows = ranks.gather(
                [
                    self._version,
                    digest,
                    refusal is None,
                    values.learning_rate,
                    values.ent_coef,
                    requests.pause,
                    requests.stop,
                ]
            )
        except RuntimeError as error:  # torch.distributed's: a rank gone, or silent for rank_timeout_s
            raise self._group_failed(error) from None
        if refusal is not None:
            raise refusal
        refused = [rank for rank, row in enumerate(rows) if not row[2]]
        if refused:
            raise invalid_argument(
                f"rank(s) {refused} of {ranks.world_size} refused their batch of policy version {self._version}, "
                "so no rank learnt from this update's batches; the policy stays at this version: sample again "
                "and resubmit"
            )
        versions, digests = [int(row[0]) for row in rows], [int(row[1]) for row in rows]
        if len(set(versions)) > 1 or len(set(digests)) > 1:
            raise failed_precondition(
                f"the learner ranks hold other policies (versions {versions}, weight digests "
                f"{[f'{d:012x}' for d in digests]}); restart the group so that every rank resumes from the "
                f"same checkpoint in {self.config.checkpoint_dir}"
            )
        chosen = Hyperparameters(learning_rate=rows[0][3], ent_coef=rows[0][4])
        if ranks.rank != 0:
            self._hyperparameters = chosen  # what GetStatus shows: the values this rank trains with
        return chosen, Requests(pause=any(row[5] for row in rows), stop=any(row[6] for row in rows))

    def _group_failed(self, error: BaseException) -> LearnerError:
        """A collective failed (this rank's state was rolled back or never touched): record it, tell the
        server, and return the UNAVAILABLE to answer."""
        return unavailable(self.fail_group(f"{type(error).__name__}: {shorten(str(error))}"))

    def fail_group(self, cause: str) -> str:
        """Record that the group can no longer update, because of `cause` (a failed collective, or what
        the rank's watch of the group saw: learner/group.py, group_broken), and tell the server, which
        stops this rank (exit 1). Returns the message."""
        assert self._ranks is not None
        self.group_failure = (
            f"the group of {self._ranks.world_size} learner ranks failed at policy version {self._version} "
            f"({cause}): a rank left, or sent no batch within "
            f"rank_timeout_s={self.config.rank_timeout_s:g} s; nothing was updated, rank {self._ranks.rank} stops, "
            "and the run resumes from the last checkpoint when the group restarts (torchrun --max-restarts, or "
            "the platform's restart)"
        )
        log.error("%s", self.group_failure)
        if self.on_group_failure is not None:
            self.on_group_failure()
        return self.group_failure

    def _agree_on_resume(self, ranks: Ranks) -> None:
        """Every rank resumed the same version from the newest checkpoint (a shared checkpoint_dir), or
        none: CheckpointError on every rank otherwise."""
        rows = ranks.gather([self._version if self.initialized else -1])
        versions = [int(row[0]) for row in rows]
        if len(set(versions)) > 1:
            raise CheckpointError(
                f"the learner ranks resumed other policy versions ({versions}, -1: none) from their checkpoint "
                f"directories; every rank must read the same checkpoint_dir (rank {ranks.rank}'s: "
                f"{self.config.checkpoint_dir})"
            )

    def _refuse_stale(self, batch_version: int) -> None:
        current = self._version
        if batch_version != current:
            with self._counter_lock:
                self.stale_batches_refused += 1
            raise failed_precondition(
                f"batch.policy_version is {batch_version} but the current policy version is {current}; "
                f"on-policy learning only accepts batches sampled by version {current}: fetch it with "
                "GetPolicy, sample again and resubmit"
            )

    def _check_batch(self, batch: RolloutBatch) -> None:
        """Shapes and dtypes against the spaces, before any state is touched."""
        assert self._spaces is not None
        observation_space, action_space = self._spaces
        action_shape = tuple(action_space.shape) if action_space.kind == "box" else ()
        try:
            batch.validate(obs_shape=tuple(observation_space.shape), action_shape=action_shape)
        except ValueError as error:
            raise invalid_argument(
                f"{error} (spaces: observation {describe_space(observation_space)}, "
                f"action {describe_space(action_space)})"
            ) from None
        if action_space.kind == "box" and not batch.actions.is_floating_point():
            raise invalid_argument(
                f"RolloutBatch.actions: the action space is {describe_space(action_space)}, so actions must be "
                f"float, got {batch.actions.dtype}; send FLOAT32"
            )
        if action_space.kind == "discrete":
            if batch.actions.dtype != torch.int64:
                raise invalid_argument(
                    f"RolloutBatch.actions: the action space is {describe_space(action_space)}, so actions must be "
                    f"int64, got {batch.actions.dtype}; send INT64"
                )
            taken = batch.actions[batch.valid_mask]
            if bool(((taken < 0) | (taken >= action_space.n)).any()):
                raise invalid_argument(
                    f"RolloutBatch.actions: valid actions must lie in [0, {action_space.n}), got "
                    f"[{int(taken.min())}, {int(taken.max())}]"
                )
        if batch.num_valid == 0:
            raise invalid_argument(
                "RolloutBatch.valid_mask: no valid transition; a batch needs at least one valid step"
            )

    def _anneal_factor(self) -> float:
        """What the learning rate in force is multiplied by for the next update: CleanRL's linear
        annealing, 1 - v / N at version v, held at 1 / N (the last annealed step) after N updates.
        A learning rate set over the API is annealed from the version it takes effect on the same way."""
        n = self.config.anneal_lr_updates
        return 1.0 if n <= 0 else max(1.0 - self._version / n, 1.0 / n)

    def _ppo_config_in_force(self) -> PPOConfig:
        values = self._hyperparameters
        return replace(self.ppo_config, lr=values.learning_rate, ent_coef=values.ent_coef)

    def _publish(self) -> Policy:
        assert self._learner is not None and self._spaces is not None
        snapshot = Policy(
            version=self._version,
            weights=export_weights(self._learner.policy),
            hidden_sizes=self._hidden_sizes,
            observation_space=self._spaces[0],
            action_space=self._spaces[1],
        )
        self._published = snapshot
        return snapshot

    def _write_checkpoint(self) -> Path:
        assert self._learner is not None and self._spaces is not None
        checkpoint = Checkpoint(
            policy_version=self._version,
            observation_space=self._spaces[0],
            action_space=self._spaces[1],
            hidden_sizes=self._hidden_sizes,
            learner_state=self._learner.state_dict(),
            config={**self.config.model_dump(mode="json"), "device": self.device_name, "torch": str(torch.__version__)},
            hyperparameters=self._hyperparameters,
            configured_hyperparameters=self._configured_hyperparameters,
        )
        path = save_checkpoint(self.config.checkpoint_dir, checkpoint)
        prune_checkpoints(self.config.checkpoint_dir, self.config.keep_checkpoints)
        self.last_checkpoint = path
        self._checkpointed_version = self._version
        self._checkpointed_hyperparameters = self._hyperparameters
        return path

    def _write_checkpoint_logged(self) -> Path | None:
        # A periodic checkpoint that fails (disk full) must not fail the update that already
        # happened: the version moved on. It is logged, and the next one tries again.
        if not self._writes_checkpoints:
            return None  # rank 0 writes the group's checkpoints (its weights are every rank's)
        try:
            return self._write_checkpoint()
        except Exception as error:
            log.error("checkpoint at version %d failed: %s: %s", self._version, type(error).__name__, error)
            return None

    def _restore(self, checkpoint: Checkpoint) -> None:
        try:
            action_spec = check_spaces(checkpoint.observation_space, checkpoint.action_space, checkpoint.hidden_sizes)
        except Exception as error:
            raise CheckpointError(f"checkpoint {checkpoint.path}: {error}") from None
        if checkpoint.hidden_sizes != self._hidden_sizes:
            log.warning(
                "checkpoint %s has hidden sizes %s, the config %s; using the checkpoint's (its weights fit only those)",
                checkpoint.path,
                list(checkpoint.hidden_sizes),
                list(self._hidden_sizes),
            )
        # The values in force when the checkpoint was written, unless the config changed since.
        values = hyperparameters.resumed(
            self._configured_hyperparameters, checkpoint.hyperparameters, checkpoint.configured_hyperparameters
        )
        policy = ActorCritic(tuple(checkpoint.observation_space.shape), action_spec, checkpoint.hidden_sizes)
        # A normaliser when the checkpoint's weights carry one (fit_normalizer), whatever the config says.
        learner = PPOLearner(policy, self.ppo_config, device=self.device)
        try:
            learner.load_state_dict(checkpoint.learner_state)
        except Exception as error:
            raise CheckpointError(
                f"checkpoint {checkpoint.path} does not fit its own spaces and hidden sizes "
                f"({type(error).__name__}: {error})"
            ) from None
        # Adam's state_dict carries the learning rate it was saved with; the resumed one wins.
        learner.set_hyperparameters(learning_rate=values.learning_rate, ent_coef=values.ent_coef)
        self._hyperparameters = values
        self._learner = learner
        self._spaces = (checkpoint.observation_space, checkpoint.action_space)
        self._hidden_sizes = checkpoint.hidden_sizes
        self._version = checkpoint.policy_version
        self._publish()
        self.last_checkpoint = checkpoint.path
        self._checkpointed_version = checkpoint.policy_version
        # A checkpoint of an older learner holds none: the config's, which it resumed with, count as saved.
        self._checkpointed_hyperparameters = checkpoint.hyperparameters or values
        log.info("resumed from %s at policy version %d", checkpoint.path, checkpoint.policy_version)

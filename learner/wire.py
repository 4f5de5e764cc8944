"""The learner's wire format: its messages (fast.v1 learner.proto) to and from Python values.

One home for both directions, so the client (learner/client.py) and the servicer
(learner/servicer.py) cannot drift apart: what one encodes, the other decodes here.

    batch    a dict of numpy arrays keyed by RolloutBatch's field names (plus `policy_version`)
    stats    a dict of floats keyed by STATS_FIELDS (PPOLearner.update's statistics)
    Policy   a policy version with its weights, hidden sizes and spaces
    Hyperparameters  the learning rate and entropy coefficient the next update uses
    LearnerStatus  what GetStatus reports
    CheckpointInfo  one checkpoint file, as ListCheckpoints lists it
    ExportedPolicy  a serialised deterministic policy (ExportPolicy), EXPORT_FORMATS its formats

Deliberately light (numpy, fast.*, the generated stubs): the broker imports it with the client
and must not load torch's optimiser or the learner's maths to speak to the learner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from fast import tensor
from fast.spaces import SpaceSpec, space_from_proto, space_to_proto
from fast.v1 import learner_pb2 as pb

# Tensor fields of fast.v1.RolloutBatch, in proto order; the names are learner.batch.RolloutBatch's.
BATCH_TENSOR_FIELDS = (
    "obs",
    "actions",
    "logprobs",
    "values",
    "rewards",
    "terminated",
    "truncated",
    "valid_mask",
    "bootstrap_values",
)
# Fields of fast.v1.UpdateStats, in proto order.
STATS_FIELDS = (
    "policy_loss",
    "value_loss",
    "entropy",
    "approx_kl",
    "clip_fraction",
    "explained_variance",
    "grad_norm",
    "update_time_s",
    "num_valid",
    "num_total",
    "learning_rate",
    "ent_coef",
    "reward_scale",
    "lr_anneal_factor",
)
# ExportPolicy's formats: the name the learner's code uses, and the wire's enum value.
EXPORT_FORMATS = {"torchscript": pb.POLICY_FORMAT_TORCHSCRIPT, "onnx": pb.POLICY_FORMAT_ONNX}


# -- the batch ---------------------------------------------------------------------------------


def batch_to_proto(arrays: Mapping[str, Any], policy_version: int) -> pb.RolloutBatch:
    """Encode the nine RolloutBatch arrays (sent with their dtypes as given; the learner validates)."""
    extra = set(arrays) - set(BATCH_TENSOR_FIELDS) - {"policy_version"}
    missing = [name for name in BATCH_TENSOR_FIELDS if name not in arrays]
    if missing or extra:
        raise ValueError(
            f"submit: arrays must hold exactly {list(BATCH_TENSOR_FIELDS)}; missing {missing}, unknown {sorted(extra)}"
        )
    if "policy_version" in arrays and int(arrays["policy_version"]) != policy_version:
        raise ValueError(
            f"submit: arrays['policy_version']={arrays['policy_version']} disagrees with "
            f"policy_version={policy_version}"
        )
    return pb.RolloutBatch(
        policy_version=policy_version,
        **{name: tensor.to_proto(np.asarray(arrays[name])) for name in BATCH_TENSOR_FIELDS},
    )


def batch_arrays_from_proto(message: pb.RolloutBatch) -> dict[str, Any]:
    """Decode a wire batch into RolloutBatch.from_numpy's dict form; TensorError names a missing or bad field.

    Only the encoding is checked here; shapes, dtypes and the episode invariant are
    RolloutBatch.validate's.
    """
    arrays: dict[str, Any] = {"policy_version": int(message.policy_version)}
    for name in BATCH_TENSOR_FIELDS:
        if not message.HasField(name):
            raise tensor.TensorError(f"batch.{name} is missing; every field of RolloutBatch must be set (docs/smpo.md)")
        arrays[name] = tensor.from_proto(getattr(message, name), field=f"batch.{name}")
    if arrays["obs"].dtype.kind in "biu":
        # Integer and boolean observations (camera pixels as UINT8) travel compact; the network reads floats.
        arrays["obs"] = arrays["obs"].astype(np.float32)
    return arrays


# -- the update statistics ---------------------------------------------------------------------


def stats_to_proto(stats: Mapping[str, float]) -> pb.UpdateStats:
    return pb.UpdateStats(**{name: stats[name] for name in STATS_FIELDS if name in stats})


def stats_from_proto(message: pb.UpdateStats) -> dict[str, float]:
    return {name: getattr(message, name) for name in STATS_FIELDS}


# -- the policy and the status -----------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """A policy version as the learner ships it to samplers."""

    version: int
    weights: bytes  # learner.policy.export_weights bytes; b"" when the caller already held `version`
    hidden_sizes: tuple[int, ...]
    observation_space: SpaceSpec
    action_space: SpaceSpec

    def to_proto(self) -> pb.Policy:
        return pb.Policy(
            version=self.version,
            weights=self.weights,
            hidden_sizes=list(self.hidden_sizes),
            observation_space=space_to_proto(self.observation_space),
            action_space=space_to_proto(self.action_space),
        )

    @classmethod
    def from_proto(cls, message: pb.Policy) -> Policy:
        # `cls`, so a subclass that adds behaviour (learner.client.Policy) decodes as itself.
        return cls(
            version=message.version,
            weights=message.weights,
            hidden_sizes=tuple(message.hidden_sizes),
            observation_space=space_from_proto(message.observation_space, field="policy.observation_space"),
            action_space=space_from_proto(message.action_space, field="policy.action_space"),
        )


@dataclass(frozen=True)
class Hyperparameters:
    """The hyper-parameters that can change while a run goes on (UpdateHyperparameters)."""

    learning_rate: float  # Adam's learning rate
    ent_coef: float  # weight of the entropy bonus in the loss

    def to_proto(self) -> pb.Hyperparameters:
        return pb.Hyperparameters(learning_rate=self.learning_rate, ent_coef=self.ent_coef)

    @classmethod
    def from_proto(cls, message: pb.Hyperparameters) -> Hyperparameters:
        return cls(learning_rate=message.learning_rate, ent_coef=message.ent_coef)


@dataclass(frozen=True)
class LearnerStatus:
    """What GetStatus reports."""

    initialized: bool
    policy_version: int
    device: str  # "cpu", "cuda:0", ...
    updates_this_process: int
    last_stats: dict[str, float] | None  # the last update's stats, None before the first update
    last_checkpoint: str  # path on the learner's machine, "" if none
    stale_batches_refused: int
    hyperparameters: Hyperparameters | None = None  # what the next update uses; None from an older learner

    def to_proto(self) -> pb.GetStatusResponse:
        return pb.GetStatusResponse(
            initialized=self.initialized,
            policy_version=self.policy_version,
            device=self.device,
            updates_this_process=self.updates_this_process,
            last_stats=stats_to_proto(self.last_stats) if self.last_stats is not None else None,
            last_checkpoint=self.last_checkpoint,
            stale_batches_refused=self.stale_batches_refused,
            hyperparameters=self.hyperparameters.to_proto() if self.hyperparameters is not None else None,
        )

    @classmethod
    def from_proto(cls, message: pb.GetStatusResponse) -> LearnerStatus:
        return cls(
            initialized=message.initialized,
            policy_version=message.policy_version,
            device=message.device,
            updates_this_process=message.updates_this_process,
            last_stats=stats_from_proto(message.last_stats) if message.HasField("last_stats") else None,
            last_checkpoint=message.last_checkpoint,
            stale_batches_refused=message.stale_batches_refused,
            hyperparameters=(
                Hyperparameters.from_proto(message.hyperparameters) if message.HasField("hyperparameters") else None
            ),
        )


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint file as ListCheckpoints reports it (the version is read from its name, the file is not opened)."""

    path: str  # on the learner's file system
    policy_version: int
    size_bytes: int
    modified_unix: float  # when it was written, Unix seconds

    def to_proto(self) -> pb.CheckpointInfo:
        return pb.CheckpointInfo(
            path=self.path,
            policy_version=self.policy_version,
            size_bytes=self.size_bytes,
            modified_unix=self.modified_unix,
        )

    @classmethod
    def from_proto(cls, message: pb.CheckpointInfo) -> CheckpointInfo:
        return cls(
            path=message.path,
            policy_version=message.policy_version,
            size_bytes=message.size_bytes,
            modified_unix=message.modified_unix,
        )


@dataclass(frozen=True)
class ExportedPolicy:
    """A policy serialised to run without this project: float32 obs [batch, *observation_shape] in, the
    deterministic action [batch, *action shape] out (learner/export.py)."""

    model: bytes  # TorchScript (torch.jit.load) or ONNX (input "obs", output "action")
    policy_version: int
    observation_shape: tuple[int, ...]

    def to_proto(self) -> pb.ExportPolicyResponse:
        return pb.ExportPolicyResponse(
            model=self.model, policy_version=self.policy_version, observation_shape=list(self.observation_shape)
        )

    @classmethod
    def from_proto(cls, message: pb.ExportPolicyResponse) -> ExportedPolicy:
        return cls(
            model=message.model,
            policy_version=message.policy_version,
            observation_shape=tuple(message.observation_shape),
        )

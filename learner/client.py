"""An asyncio client of the fast.v1 Learner API that speaks numpy.

Used by the broker; any other client can be generated from protos/ alone. Every call has a
deadline; errors surface as grpc.aio.AioRpcError (FAILED_PRECONDITION for a stale batch or a
call before Initialize, INVALID_ARGUMENT for a malformed batch). Typical loop:

    async with LearnerClient(address) as learner:
        await learner.initialize(obs_space, action_space)        # SpaceSpec from the simulators
        policy = await learner.get_policy()
        actor_critic = policy.actor_critic()                      # a CPU ActorCritic at policy.version
        while True:
            arrays = sample(actor_critic)                         # RolloutBatch fields, [T, N] numpy
            reply = await learner.submit(arrays, policy_version=policy.version)
            policy = reply.policy                                 # the new version, weights included
            import_weights(actor_critic, policy.weights)

On FAILED_PRECONDITION from `submit` (someone else advanced the version, or the learner
restarted from an older checkpoint), call `get_policy()` and sample again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from fast.rpc import Credentials, RpcClient
from fast.spaces import SpaceSpec, space_to_proto
from fast.v1 import learner_pb2 as pb
from fast.v1 import learner_pb2_grpc as pb_grpc
from learner import wire
from learner.wire import (
    EXPORT_FORMATS,
    CheckpointInfo,
    ExportedPolicy,
    Hyperparameters,
    LearnerStatus,
    batch_to_proto,
    stats_from_proto,
)

if TYPE_CHECKING:  # the network imports torch: only `actor_critic` needs it, and the broker never calls it
    from learner.policy import ActorCritic

__all__ = [
    "CheckpointInfo",
    "ExportedPolicy",
    "Hyperparameters",
    "LearnerClient",
    "LearnerStatus",
    "Policy",
    "SubmitReply",
]


class Policy(wire.Policy):
    """A policy version as the learner shipped it, and the network it describes."""

    def actor_critic(self) -> ActorCritic:
        """A fresh CPU ActorCritic holding these weights (ValueError if weights were left out)."""
        if not self.weights:
            raise ValueError(f"policy version {self.version} came without weights (known_version was current)")
        from learner.policy import ActorCritic, import_weights

        policy = ActorCritic(tuple(self.observation_space.shape), self.action_space, self.hidden_sizes)
        import_weights(policy, self.weights)
        return policy


@dataclass(frozen=True)
class SubmitReply:
    stats: dict[str, float]  # policy_loss, value_loss, entropy, approx_kl, clip_fraction,
    # explained_variance, grad_norm, update_time_s, num_valid, num_total, learning_rate, ent_coef
    policy_version: int  # the version after the update
    policy: Policy | None  # the updated policy, when submitted with return_policy=True
    run_pauses: bool = False  # some rank's caller asked to pause with this batch: every caller pauses now
    run_stops: bool = False  # some rank's caller asked to stop with this batch: every caller stops now


class LearnerClient(RpcClient):
    """numpy in, numpy/dataclasses out; one channel; `timeout_s` on every call but SubmitBatch,
    which runs a whole PPO update and gets `update_timeout_s`. Every call carries the run token
    (`credentials`, default the environment's; fast/auth.py)."""

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = 30.0,
        update_timeout_s: float = 600.0,
        max_message_bytes: int = 256 << 20,
        credentials: Credentials | None = None,
    ) -> None:
        super().__init__(address, max_message_bytes=max_message_bytes, credentials=credentials)
        self.timeout_s = timeout_s
        self.update_timeout_s = update_timeout_s
        self._stub = self.stub(pb_grpc.LearnerStub)
        # Learner ranks in the learner's group, as its Initialize answered (1 until then, and from a
        # learner older than the field): a broker of a group stops only when an update says run_stops.
        self.world_size = 1

    async def initialize(self, observation_space: SpaceSpec, action_space: SpaceSpec) -> tuple[int, bool]:
        """Set the spaces (idempotent); returns (policy_version, resumed), and keeps `world_size`."""
        r = await self._stub.Initialize(
            pb.InitializeRequest(
                observation_space=space_to_proto(observation_space), action_space=space_to_proto(action_space)
            ),
            timeout=self.timeout_s,
        )
        self.world_size = max(1, r.world_size)
        return r.policy_version, r.resumed

    async def get_policy(self, known_version: int = -1) -> Policy:
        """The current policy; its weights are b"" when `known_version` is already current."""
        r = await self._stub.GetPolicy(pb.GetPolicyRequest(known_version=known_version), timeout=self.timeout_s)
        return Policy.from_proto(r.policy)

    async def submit(
        self,
        arrays: Mapping[str, Any],
        policy_version: int,
        *,
        return_policy: bool = True,
        pause_requested: bool = False,
        stop_requested: bool = False,
    ) -> SubmitReply:
        """Learn from one batch sampled by `policy_version`.

        `arrays` holds the RolloutBatch fields as numpy arrays laid out [T, N] (docs/smpo.md):
        obs, actions, logprobs, values, rewards, terminated, truncated, valid_mask, bootstrap_values.
        `pause_requested` / `stop_requested`: the caller was asked to pause / stop; the reply's run_pauses /
        run_stops say whether any rank's caller was (every rank's caller then pauses / stops after this
        batch: broker/group_control.py).
        """
        r = await self._stub.SubmitBatch(
            pb.SubmitBatchRequest(
                batch=batch_to_proto(arrays, policy_version),
                return_policy=return_policy,
                pause_requested=pause_requested,
                stop_requested=stop_requested,
            ),
            timeout=self.update_timeout_s,
        )
        return SubmitReply(
            stats=stats_from_proto(r.stats),
            policy_version=r.policy_version,
            policy=Policy.from_proto(r.policy) if r.HasField("policy") else None,
            run_pauses=r.run_pauses,
            run_stops=r.run_stops,
        )

    async def status(self) -> LearnerStatus:
        r = await self._stub.GetStatus(pb.GetStatusRequest(), timeout=self.timeout_s)
        return LearnerStatus.from_proto(r)

    async def save_checkpoint(self) -> tuple[Path, int]:
        """Write a checkpoint now; returns (path on the learner's machine, policy_version)."""
        r = await self._stub.SaveCheckpoint(pb.SaveCheckpointRequest(), timeout=self.update_timeout_s)
        return Path(r.path), r.policy_version

    async def update_hyperparameters(
        self, *, learning_rate: float | None = None, ent_coef: float | None = None
    ) -> tuple[Hyperparameters, int]:
        """Change either or both from the next update on; returns (the values in force, the first version
        trained with them)."""
        request = pb.UpdateHyperparametersRequest()
        if learning_rate is not None:
            request.learning_rate = learning_rate
        if ent_coef is not None:
            request.ent_coef = ent_coef
        r = await self._stub.UpdateHyperparameters(request, timeout=self.timeout_s)
        return Hyperparameters.from_proto(r.hyperparameters), r.effective_from_version

    async def list_checkpoints(self) -> list[CheckpointInfo]:
        """The checkpoints on the learner's disk, newest first."""
        r = await self._stub.ListCheckpoints(pb.ListCheckpointsRequest(), timeout=self.timeout_s)
        return [CheckpointInfo.from_proto(info) for info in r.checkpoints]

    async def export_policy(self, format_name: str) -> ExportedPolicy:
        """The current policy as a deterministic model: `format_name` "torchscript" or "onnx"."""
        if format_name not in EXPORT_FORMATS:
            raise ValueError(f"export_policy: format_name must be one of {list(EXPORT_FORMATS)}, got {format_name!r}")
        r = await self._stub.ExportPolicy(
            pb.ExportPolicyRequest(format=EXPORT_FORMATS[format_name]), timeout=self.update_timeout_s
        )
        return ExportedPolicy.from_proto(r)

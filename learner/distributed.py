"""Data-parallel learner ranks over torch.distributed: R ranks' update equals one learner's on the union.

R learner ranks hold batches B_1..B_R (each `[T_r, N_r]`, padded anyhow). Their **union** is the
batch whose slots are rank 0's slots, then rank 1's, and so on (concatenated along N; a shorter T
padded at the end). `PPOLearner.update(batch, ranks)` on every rank takes the step one learner
takes on that union, to rounding (docs/smpo.md, "Data-parallel ranks"):

- **Global indices.** The learner compacts its valid transitions in (slot, step) order, so the
  union's compacted list is rank 0's list, then rank 1's, ...: rank r's n_r transitions are the
  global indices [offset_r, offset_r + n_r), offset_r = n_0 + ... + n_{r-1} (`RankShare`, from one
  all-gather of the counts, which also tells every rank whether another refused its batch).
- **Minibatches.** Every rank draws the same permutation of the n = n_0 + ... + n_{R-1} global
  indices from its shuffle generator (the same seed, restored from the same checkpoint, advanced
  by the same draws), splits it into `num_minibatches` parts as one learner would, and keeps of
  part k the indices in its own range (`RankShare.local`). The union over the ranks of their
  part k is exactly one learner's minibatch k.
- **Loss.** SMPO's masked means divide by the valid count of part k over all ranks, and the
  advantages of part k are normalised with the mean and std of all ranks' entries of part k
  (`smpo_loss(..., all_sum=ranks.all_sum)`): each rank's loss is its share of one learner's.
- **Gradients.** The loss is a sum over transitions with every normalising constant shared, so
  one learner's gradient is the *sum* of the ranks' gradients: `sum_gradients` all-reduces SUM
  (one flat buffer), then every rank clips the same gradient by the same norm and takes the same
  Adam step. Not DDP: DDP *averages* (it would need every loss scaled by R and undone in the clip
  norm) and hooks the backward of a wrapped module, while the sum is the exact statement of the
  maths and lets a rank whose share of part k is empty join with a zero gradient.
- **Normalisation statistics.** Reward scale and observation normaliser merge the moments of
  every rank's batch (count, sum, squared deviations summed over the ranks), so they stay equal
  on every rank (learner.policy.merged_moments).

World size 1 never gets here: `update(batch)` without ranks is the single learner, unchanged.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
import torch.distributed as dist


class RankRefused(ValueError):
    """Another rank refused its batch for this update, so no rank updates (nothing half-applied)."""


@dataclass(frozen=True)
class RankShare:
    """Rank `rank`'s place in the global index space of one update: its valid transitions are the
    global indices [offset, offset + num_valid) of `total` (see module docstring)."""

    rank: int
    offset: int
    num_valid: int
    total: int

    def local(self, minibatch: torch.Tensor) -> torch.Tensor:
        """This rank's entries of a global minibatch, as indices into its compacted list (in the
        minibatch's order; empty when it holds none)."""
        mine = (minibatch >= self.offset) & (minibatch < self.offset + self.num_valid)
        return minibatch[mine] - self.offset


class Ranks:
    """This process's rank in a torch.distributed process group of data-parallel learners, and the
    reductions the update needs. The group must be initialised (`init_process_group`) first."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("Ranks: torch.distributed is not initialised; call init_process_group first")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        # NCCL reduces CUDA tensors; gloo (CPU ranks, or a mixed group) reduces CPU ones.
        self.comm_device = torch.device("cuda", torch.cuda.current_device()) if self._nccl() else torch.device("cpu")

    def _nccl(self) -> bool:
        return dist.get_backend(self.group) == dist.Backend.NCCL

    def all_sum(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of `x` over the ranks: a detached copy on `x`'s device and dtype (bool summed as int64)."""
        dtype = torch.int64 if x.dtype == torch.bool else x.dtype
        buffer = x.detach().to(self.comm_device, dtype, copy=True)
        dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=self.group)
        return buffer.to(x.device)

    def share(self, num_valid: int) -> RankShare:
        """Every rank's valid count gathered: this rank's `RankShare`. RankRefused when another rank
        refused its batch (`refuse`), so that every rank refuses the update together."""
        counts = self._gather_counts(num_valid)
        refused = [rank for rank, count in enumerate(counts) if count < 0]
        if refused:
            raise RankRefused(
                f"rank(s) {refused} of {self.world_size} refused their batch for this update; no rank was updated"
            )
        if sum(counts) == 0:
            raise ValueError(f"no valid transition on any of the {self.world_size} ranks (valid counts {counts})")
        return RankShare(
            rank=self.rank, offset=sum(counts[: self.rank]), num_valid=counts[self.rank], total=sum(counts)
        )

    def refuse(self) -> None:
        """This rank refuses its batch: take part in the gather of `share` with a mark that makes the
        other ranks raise RankRefused (this rank raises its own error)."""
        self._gather_counts(-1)

    def _gather_counts(self, count: int) -> list[int]:
        mine = torch.tensor([count], dtype=torch.int64, device=self.comm_device)
        gathered = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(gathered, mine, group=self.group)
        return [int(count) for count in gathered]

    def gather(self, values: Sequence[float]) -> list[list[float]]:
        """Every rank's `values` (the same count on each), rank by rank, as float64: a control message
        (versions, digests, hyper-parameters) that every rank reads alike."""
        mine = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.comm_device)
        gathered = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(gathered, mine, group=self.group)
        return [row.cpu().tolist() for row in gathered]

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Replace every parameter's gradient by its sum over the ranks (one all-reduce of one flat
        buffer; a parameter without a gradient counts as zero and gets the sum)."""
        parameters = list(parameters)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
        flat = torch.cat([g.reshape(-1) for g in grads]).to(self.comm_device)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        flat = flat.to(parameters[0].device)
        start = 0
        for parameter in parameters:
            size = parameter.numel()
            parameter.grad = flat[start : start + size].view_as(parameter).clone()
            start += size


def state_digest(module: torch.nn.Module) -> str:
    """SHA-256 of a module's state (every parameter and buffer: names, dtypes, shapes, bytes), in hex.
    Equal on two ranks exactly when their weights (and normaliser statistics) are bit-identical."""
    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{value.dtype}:{list(value.shape)};".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()

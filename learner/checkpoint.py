"""Learner checkpoints on disk: atomic writes, newest-first resume, pruning.

One file per policy version, `ckpt-<version, 9 digits>.pt`, so names sort by version. A file
is a `torch.save` of a plain dict (loaded back with `weights_only=True`, so a checkpoint
cannot run code):

    format             "fast.learner.checkpoint/1"
    policy_version     int, the version the weights are
    observation_space  bytes, a serialised fast.v1.Space (the wire form, one spelling everywhere)
    action_space       bytes, a serialised fast.v1.Space
    hidden_sizes       list[int], to rebuild the ActorCritic before loading its weights
    learner            PPOLearner.state_dict(): policy weights, Adam state, shuffle RNG state
    hyperparameters    {"in_force": {learning_rate, ent_coef}, "configured": {learning_rate, ent_coef}}:
                       the values the next update would have used (UpdateHyperparameters' changes
                       included) and the config's; absent from files of older learners
    config             dict, a summary of the LearnerConfig that wrote it (for people, not read back)

`policy_weights` turns a checkpoint into the policy's weights bytes, for whoever plays it
(`fast train`'s evaluation, `fast compare`, the benchmarks). `describe_checkpoints` lists the
files as ListCheckpoints reports them.

A write goes to a hidden temporary file in the same directory, is fsynced, then renamed over
the final name: a crash (kill -9, power loss) leaves either the old set of checkpoints or the
new one, never a half-written `ckpt-*.pt`. Should a newest file still be unreadable (disk
fault, a hand-edited file), `load_latest` logs it and falls back to the one before.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fast.spaces import SpaceSpec, space_from_proto, space_to_proto
from fast.tensor import TensorError
from fast.v1 import tensor_pb2
from learner.checkpoint_files import checkpoint_path, list_checkpoints
from learner.hyperparameters import usable
from learner.policy import ActorCritic, export_weights, fit_normalizer
from learner.wire import CheckpointInfo, Hyperparameters

FORMAT = "fast.learner.checkpoint/1"
_TEMP_PREFIX = ".ckpt-"
_LEARNER_KEYS = ("policy", "optimizer", "shuffle_generator")

log = logging.getLogger("fast.learner")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read back; the message names the file and the fault."""


@dataclass(frozen=True)
class Checkpoint:
    """Everything a learner needs to resume exactly where it was."""

    policy_version: int
    observation_space: SpaceSpec
    action_space: SpaceSpec
    hidden_sizes: tuple[int, ...]
    learner_state: dict[str, Any]  # PPOLearner.state_dict()
    config: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None  # where it was read from or written to
    # The values the next update would have used, and the config's then (learner.hyperparameters.resumed
    # decides between them and a new config's); None in checkpoints of learners that did not save them.
    hyperparameters: Hyperparameters | None = None
    configured_hyperparameters: Hyperparameters | None = None


def describe_checkpoints(directory: Path) -> list[CheckpointInfo]:
    """Every checkpoint in `directory`, newest (highest version) first, with its size and write time.

    The files are not opened (the version is the name's). A file deleted between the listing
    and its stat (a concurrent prune) is left out, not an error.
    """
    described = []
    for version, path in reversed(list_checkpoints(directory)):
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        described.append(
            CheckpointInfo(path=str(path), policy_version=version, size_bytes=stat.st_size, modified_unix=stat.st_mtime)
        )
    return described


def latest_checkpoint(directory: Path) -> Path | None:
    """Path of the newest checkpoint (highest version), None if there is none."""
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def save_checkpoint(directory: Path, checkpoint: Checkpoint) -> Path:
    """Write `checkpoint` atomically as `ckpt-<version>.pt` (replacing one of that version); return its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(directory, checkpoint.policy_version)
    payload = {
        "format": FORMAT,
        "policy_version": int(checkpoint.policy_version),
        "observation_space": space_to_proto(checkpoint.observation_space).SerializeToString(),
        "action_space": space_to_proto(checkpoint.action_space).SerializeToString(),
        "hidden_sizes": [int(width) for width in checkpoint.hidden_sizes],
        "learner": checkpoint.learner_state,
        "config": checkpoint.config,
    }
    if checkpoint.hyperparameters is not None and checkpoint.configured_hyperparameters is not None:
        payload["hyperparameters"] = {
            "in_force": _hyperparameters_dict(checkpoint.hyperparameters),
            "configured": _hyperparameters_dict(checkpoint.configured_hyperparameters),
        }
    temp = directory / f"{_TEMP_PREFIX}{final.name}.tmp-{os.getpid()}"
    try:
        with open(temp, "wb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, final)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _fsync_directory(directory)
    return final


def load_checkpoint(path: Path) -> Checkpoint:
    """Read one checkpoint; CheckpointError naming the file if it is unreadable or not a learner checkpoint."""
    path = Path(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for truncated or foreign files
        raise CheckpointError(
            f"checkpoint {path} is unreadable ({type(error).__name__}: {_first_line(error)})"
        ) from error
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise CheckpointError(f"checkpoint {path} is not a {FORMAT} file (format {found!r})")
    try:
        learner_state = payload["learner"]
        missing = [key for key in _LEARNER_KEYS if key not in learner_state]
        if missing:
            raise CheckpointError(f"checkpoint {path}: learner state lacks {missing}")
        saved = payload.get("hyperparameters")
        in_force, configured = (
            (_hyperparameters(saved["in_force"], path), _hyperparameters(saved["configured"], path))
            if saved is not None
            else (None, None)
        )
        return Checkpoint(
            policy_version=int(payload["policy_version"]),
            observation_space=_space(payload["observation_space"], "observation_space", path),
            action_space=_space(payload["action_space"], "action_space", path),
            hidden_sizes=tuple(int(width) for width in payload["hidden_sizes"]),
            learner_state=learner_state,
            config=dict(payload.get("config") or {}),
            path=path,
            hyperparameters=in_force,
            configured_hyperparameters=configured,
        )
    except CheckpointError:
        raise
    except Exception as error:
        raise CheckpointError(
            f"checkpoint {path} is malformed ({type(error).__name__}: {_first_line(error)})"
        ) from error


def load_latest(directory: Path) -> Checkpoint | None:
    """The newest readable checkpoint in `directory`, None if there is none.

    An unreadable newest file is logged and skipped for the one before it. If every file is
    unreadable, CheckpointError: starting afresh at version 0 would silently restart the run.
    """
    found = list_checkpoints(directory)
    errors = []
    for _, path in reversed(found):
        try:
            checkpoint = load_checkpoint(path)
        except CheckpointError as error:
            log.warning("%s; falling back to an older checkpoint", error)
            errors.append(str(error))
            continue
        if errors:
            log.warning(
                "resuming from %s (version %d) after skipping %d unreadable checkpoint(s)",
                path,
                checkpoint.policy_version,
                len(errors),
            )
        return checkpoint
    if errors:
        raise CheckpointError(
            f"no readable checkpoint in {directory}: "
            + "; ".join(errors)
            + "; move the files away to start afresh at version 0, or point --checkpoint-dir elsewhere"
        )
    return None


def policy_weights(checkpoint: Checkpoint) -> bytes:
    """The checkpoint's policy as learner.policy.export_weights bytes (what PolicyRunner.load and
    import_weights take); CheckpointError naming the file if the weights do not fit its spaces."""
    try:
        policy = ActorCritic(checkpoint.observation_space.shape, checkpoint.action_space, checkpoint.hidden_sizes)
        fit_normalizer(policy, checkpoint.learner_state["policy"])
        policy.load_state_dict(checkpoint.learner_state["policy"])
    except (KeyError, RuntimeError, ValueError) as error:
        raise CheckpointError(
            f"checkpoint {checkpoint.path}: the policy weights do not fit its own spaces and hidden "
            f"sizes ({type(error).__name__}: {_first_line(error)})"
        ) from None
    return export_weights(policy)


def prune_checkpoints(directory: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoints (and temporary files of dead writers); return what was deleted."""
    if keep < 1:
        raise ValueError(f"prune_checkpoints: keep must be >= 1, got {keep}")
    directory = Path(directory)
    removed = [path for _, path in list_checkpoints(directory)[:-keep]]
    if directory.is_dir():
        own_suffix = f".tmp-{os.getpid()}"
        removed += [
            path
            for path in directory.iterdir()
            if path.name.startswith(_TEMP_PREFIX) and ".tmp-" in path.name and not path.name.endswith(own_suffix)
        ]
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def _first_line(error: Exception) -> str:
    # torch's unpickling errors run to a page of advice; the first line names the fault.
    lines = str(error).strip().splitlines()
    return lines[0][:300] if lines else ""


def _space(data: bytes, name: str, path: Path) -> SpaceSpec:
    # The same checks as Initialize's: a checkpoint of a version that stored spaces it could not
    # use (bounds of another shape, low > high) is refused here, by name, rather than restored
    # into a learner that then fails every GetPolicy and checkpoint.
    try:
        return space_from_proto(tensor_pb2.Space.FromString(data), field=name)
    except TensorError as error:
        raise CheckpointError(
            f"checkpoint {path} holds an invalid {name} ({error}); no learner can serve it (an older version "
            "stored it without checking): start on another --checkpoint-dir, or move the files away"
        ) from None


def _hyperparameters_dict(values: Hyperparameters) -> dict[str, float]:
    return {"learning_rate": float(values.learning_rate), "ent_coef": float(values.ent_coef)}


def _hyperparameters(data: dict, path: Path) -> Hyperparameters:
    values = Hyperparameters(learning_rate=float(data["learning_rate"]), ent_coef=float(data["ent_coef"]))
    if not usable(values):
        raise CheckpointError(
            f"checkpoint {path} holds unusable hyperparameters {values} (the learning rate must be finite and > 0, "
            "ent_coef finite and >= 0)"
        )
    return values


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable; not possible on every platform, hence best effort.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

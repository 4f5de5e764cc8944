"""The policy as a model that runs without this project: TorchScript or ONNX, deterministic actions.

`DeterministicPolicy` wraps a policy's actor: float32 observations `[batch, *obs_shape]` in, the
action the broker's evaluation takes out (`broker.policy_runner.PolicyRunner.act_deterministic`,
which `broker/evaluate.py` plays; tests/test_policy_export.py holds the two to 1e-5):

    Box       the Gaussian's mean, clipped to the action space's low/high (as float32, like the
              broker's), float32 [batch, *action_shape]
    Discrete  the arg-max of the logits (the first on a tie, as torch and numpy both take), int64 [batch]

`export_policy(policy, format_name)` serialises it from a published `Policy` snapshot (weights bytes), so
an export never reads weights an update is changing: it rebuilds its own CPU copy.
"""

from __future__ import annotations

import importlib.util
import io
import threading
import warnings

import numpy as np
import torch
from torch import nn

from fast.spaces import SpaceSpec
from learner.errors import unimplemented
from learner.policy import ActorCritic, import_weights
from learner.wire import EXPORT_FORMATS, Policy

FORMATS = tuple(EXPORT_FORMATS)  # "torchscript", "onnx"
ONNX_OPSET = 17  # what onnxruntime >= 1.14 runs; fixed so a torch upgrade does not change the file
ONNX_INPUT, ONNX_OUTPUT = "obs", "action"

# torch.onnx's legacy exporter keeps process-wide state while it runs (`is_in_onnx_export`), so two
# exports at once (two ExportPolicy calls) could see each other's; one at a time.
_export_lock = threading.Lock()


class DeterministicPolicy(nn.Module):
    """obs float32 `[batch, *obs_shape]` -> the deterministic action (module docstring)."""

    def __init__(self, actor_critic: ActorCritic, action_space: SpaceSpec) -> None:
        super().__init__()
        # Observation normalisation, when the policy carries it: applied to `obs` before the actor, its
        # running statistics exported as constants, so the model reads raw observations exactly as the
        # simulators send them.
        self.normalizer = actor_critic.obs_normalizer
        self.discrete = action_space.kind == "discrete"
        if self.discrete:
            self.actor = actor_critic.actor_logits
        else:
            self.actor = actor_critic.actor_mean
            self.action_shape = tuple(action_space.shape)
            # Exactly the broker's bounds: broadcast to the action shape, then cast to float32.
            low = np.broadcast_to(action_space.low, action_space.shape).astype(np.float32)
            high = np.broadcast_to(action_space.high, action_space.shape).astype(np.float32)
            self.register_buffer("low", torch.from_numpy(low.copy()))
            self.register_buffer("high", torch.from_numpy(high.copy()))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        flat = obs.flatten(start_dim=1)
        if self.normalizer is not None:
            flat = self.normalizer(flat)
        out = self.actor(flat)  # [batch, action_dim or n]
        if self.discrete:
            return out.argmax(dim=-1)
        mean = out.reshape((-1, *self.action_shape))
        # np.clip's order (max with low, then min with high); spelled with maximum/minimum because
        # ONNX's Clip takes only scalar bounds and a Box's differ per dimension.
        return torch.minimum(torch.maximum(mean, self.low), self.high)


def deterministic_policy(policy: Policy) -> DeterministicPolicy:
    """A fresh CPU `DeterministicPolicy` of a published policy snapshot, in eval mode, without gradients."""
    actor_critic = ActorCritic(tuple(policy.observation_space.shape), policy.action_space, policy.hidden_sizes)
    import_weights(actor_critic, policy.weights)
    module = DeterministicPolicy(actor_critic, policy.action_space).eval()
    module.requires_grad_(False)
    return module


def export_policy(policy: Policy, format_name: str) -> bytes:
    """The serialised deterministic policy of `policy`: `format_name` "torchscript" (torch.jit.load) or "onnx"
    (input "obs", output "action", the batch dimension dynamic).

    ValueError for an unknown format; LearnerError(UNIMPLEMENTED) for ONNX where the onnx package is
    absent. Blocking (tens of milliseconds for an MLP): run it off the event loop.
    """
    if format_name not in FORMATS:
        raise ValueError(f"format must be one of {list(FORMATS)}, got {format_name!r}")
    if format_name == "onnx" and importlib.util.find_spec("onnx") is None:
        # torch's exporter builds the graph itself but needs the onnx package to write the file.
        raise unimplemented(
            "ExportPolicy: format ONNX needs the onnx package on the learner's machine (pip install onnx); "
            "POLICY_FORMAT_TORCHSCRIPT needs nothing more"
        )
    module = deterministic_policy(policy)
    # A batch of 2, not 1: nothing in the traced graph may specialise on a batch of one.
    example = torch.zeros((2, *policy.observation_space.shape), dtype=torch.float32)
    buffer = io.BytesIO()
    with _export_lock, torch.no_grad(), warnings.catch_warnings():
        # torch marks TorchScript and the legacy ONNX exporter deprecated for authoring new code; the
        # formats themselves are what the API promises and what torch.jit.load and onnxruntime read.
        warnings.simplefilter("ignore", DeprecationWarning)
        if format_name == "torchscript":
            torch.jit.save(torch.jit.trace(module, example), buffer)
        else:
            torch.onnx.export(
                module,
                (example,),
                buffer,
                dynamo=False,  # the TorchScript-based exporter: no onnxscript needed
                input_names=[ONNX_INPUT],
                output_names=[ONNX_OUTPUT],
                dynamic_axes={ONNX_INPUT: {0: "batch"}, ONNX_OUTPUT: {0: "batch"}},
                opset_version=ONNX_OPSET,
            )
    return buffer.getvalue()

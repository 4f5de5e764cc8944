"""The learner's maths: masked batches, masked GAE, the SMPO loss and the PPO update.

Plain importable modules with no transport; the learner service wraps them.
"""

from learner.batch import RolloutBatch
from learner.device import pick_device
from learner.gae import masked_gae
from learner.policy import ActionSpec, ActorCritic, export_weights, import_weights
from learner.ppo import PPOConfig, PPOLearner
from learner.smpo import SMPOLoss, explained_variance, masked_mean, normalize_advantages, smpo_loss, smpo_loss_terms

__all__ = [
    "ActionSpec",
    "ActorCritic",
    "PPOConfig",
    "PPOLearner",
    "RolloutBatch",
    "SMPOLoss",
    "explained_variance",
    "export_weights",
    "import_weights",
    "masked_gae",
    "masked_mean",
    "normalize_advantages",
    "pick_device",
    "smpo_loss",
    "smpo_loss_terms",
]

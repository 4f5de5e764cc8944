"""The learner service: PPO with the SMPO loss on masked `[T, N]` batches, behind fast.v1.Learner.

Import the submodule you need; this package imports nothing, so a user of the wire format or
the policy network (the broker) does not load the optimiser:

    learner.wire        the messages to and from Python values (shared by client and servicer)
    learner.client      the asyncio client the broker uses
    learner.policy      the actor-critic network and its weights as bytes
    learner.checkpoint  checkpoints on disk, and a checkpoint's policy as weights bytes
    learner.checkpoint_files  checkpoint files by name (listing, paths), importable without torch
    learner.hyperparameters  what may change while a run goes on, and what a restart resumes
    learner.export      the policy as a TorchScript or ONNX model of its deterministic action
    learner.batch, .gae, .smpo, .ppo   the maths: masked batches, masked GAE, the loss, the update
    learner.ppo_config  the update's hyper-parameters (PPOConfig), importable without torch
    learner.core, .servicer, .server   the service: logic, gRPC translation, process
"""

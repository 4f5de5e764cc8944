"""The rollout broker: steps simulator servers, runs batched inference, enforces the sampling
mode (sc, autoreset, sgr, ver, fast), and assembles masked batches for the learner."""

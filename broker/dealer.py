"""Which clip a slot plays next: the training catalog shuffled, every clip visited per pass.

Clips with `clip_id % holdout_every == holdout_every - 1` are held out for evaluation and
never dealt for training (holdout_every = 0 holds out nothing).
"""

from __future__ import annotations

import numpy as np

# The project's split (clips 9, 19, 29, ... held out): the broker's default, what `fast train`
# starts it with, and what its evaluation, the benchmarks and `fast compare` hold out.
HOLDOUT_EVERY = 10


def holdout_clips(num_clips: int, holdout_every: int) -> np.ndarray:
    if holdout_every <= 0:
        return np.zeros(0, dtype=np.int64)
    ids = np.arange(num_clips, dtype=np.int64)
    return ids[ids % holdout_every == holdout_every - 1]


class ClipDealer:
    def __init__(self, num_clips: int, *, holdout_every: int, seed: int) -> None:
        held = set(holdout_clips(num_clips, holdout_every).tolist())
        self.train_clips = np.array([c for c in range(num_clips) if c not in held], dtype=np.int64)
        if self.train_clips.size == 0:
            raise ValueError(f"holdout_every={holdout_every} leaves no training clip out of {num_clips}")
        self._rng = np.random.default_rng(seed)
        self._order = self._rng.permutation(self.train_clips)
        self._next = 0
        self._episodes = 0
        self._seed = seed

    def deal(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The next `count` clips and a fresh episode seed for each."""
        clips = np.empty(count, dtype=np.int64)
        for j in range(count):
            if self._next == self._order.size:
                self._order = self._rng.permutation(self.train_clips)
                self._next = 0
            clips[j] = self._order[self._next]
            self._next += 1
        seeds = (self._seed * 1_000_003 + self._episodes + np.arange(count)) & 0x7FFFFFFF
        self._episodes += count
        return clips, seeds.astype(np.int64)

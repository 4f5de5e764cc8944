"""Episode lengths as the advisor takes them: a sample, some of it right-censored, as a distribution.

A probe or a run sees episodes that ended (their length is known) and episodes that were cut
before their end: by a global truncation of `sgr` or `fast` with `reset`, or by the probe's own
end. A cut one says only that the episode would have lasted at least that long. Counting cut
lengths as ends biases the distribution short, and dropping them biases it short too (the long
episodes are the ones most often cut). The Kaplan-Meier estimate uses both:

    S(t) = prod_{t_i <= t} (1 - d_i / n_i)

over the distinct observed lengths t_i, with d_i the episodes that *ended* at t_i and n_i the
episodes still running just before t_i (ended or cut at t_i or later: an episode cut at t_i
counts as at risk there, the usual convention for ties). P(L = t_i) = S(t_{i-1}) - S(t_i).

When the longest observation is a cut, S stays above 0 past it: nothing in the sample says when
those episodes end. That mass goes to `tail_length` (by default the longest observation, i.e.
the model treats them as ending there: a floor, biased short). Give the clips' own limit (the
longest an episode can last) when it is known.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EpisodeLengths:
    """A distribution over episode lengths (steps >= 1): distinct `values` and their probabilities."""

    values: np.ndarray  # int64 [k], increasing
    probabilities: np.ndarray  # float64 [k], > 0, summing to 1

    def __post_init__(self) -> None:
        values, p = np.asarray(self.values), np.asarray(self.probabilities)
        if values.ndim != 1 or values.size == 0 or values.shape != p.shape:
            raise ValueError(f"lengths need one probability per value; got {values.shape} and {p.shape}")
        if values.min() < 1 or np.any(np.diff(values) <= 0):
            raise ValueError(f"lengths must be increasing and >= 1 step; got {values[:8].tolist()}...")
        if np.any(p < 0) or not np.isclose(p.sum(), 1.0):
            raise ValueError(f"probabilities must be >= 0 and sum to 1; they sum to {p.sum():g}")

    @classmethod
    def fixed(cls, length: int) -> EpisodeLengths:
        """Every episode lasts `length` steps."""
        return cls(np.array([int(length)], dtype=np.int64), np.array([1.0]))

    @classmethod
    def from_sample(cls, lengths, censored=None, *, tail_length: int | None = None) -> EpisodeLengths:
        """The Kaplan-Meier estimate from observed `lengths`; `censored[j]` true where episode j was
        cut at lengths[j] rather than ended there (module docstring)."""
        lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
        censored = np.zeros(lengths.size, bool) if censored is None else np.asarray(censored, bool).reshape(-1)
        if lengths.size == 0:
            raise ValueError("no episode lengths: probe at least one episode")
        if censored.shape != lengths.shape:
            raise ValueError(f"censored has {censored.size} flags for {lengths.size} lengths; give one per length")
        if lengths.min() < 1:
            raise ValueError(f"an episode length of {int(lengths.min())}: lengths are steps, >= 1")
        longest = int(lengths.max())
        tail = longest if tail_length is None else int(tail_length)
        if tail < longest:
            raise ValueError(f"tail_length={tail} is shorter than an observed length ({longest}); give >= {longest}")
        times = np.unique(lengths)
        at_risk = np.array([np.count_nonzero(lengths >= t) for t in times])
        ended = np.array([np.count_nonzero((lengths == t) & ~censored) for t in times])
        survival = np.cumprod(1.0 - ended / at_risk)
        mass = -np.diff(np.concatenate([[1.0], survival]))
        values, probabilities = list(times), list(mass)
        if survival[-1] > 1e-12:  # the longest observation was a cut: its mass has no end in the sample
            if tail == longest:
                probabilities[-1] += survival[-1]
            else:
                values.append(tail)
                probabilities.append(survival[-1])
        values, probabilities = np.array(values, np.int64), np.array(probabilities)
        keep = probabilities > 1e-15
        return cls(values[keep], probabilities[keep] / probabilities[keep].sum())

    def survival(self, t: float) -> float:
        """S(t) = P(L > t)."""
        return float(self.probabilities[self.values > t].sum())

    @property
    def mean(self) -> float:
        return float(self.values @ self.probabilities)

    @property
    def longest(self) -> int:
        return int(self.values[-1])

    def sample(self, rng: np.random.Generator, size: int | None = None):
        """Draws of whole episode lengths."""
        drawn = rng.choice(self.values, size=size, p=self.probabilities)
        return int(drawn) if size is None else drawn.astype(np.int64)

    def sample_in_progress(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Episodes caught mid-way by a look at a slot that has run for long: (whole length, steps
        already taken), each [size]. The renewal process's stationary state: a long episode covers more
        of the slot's time, so the one in progress has length L with probability proportional to
        L * P(L) (length-biased), and its age is uniform over its steps 0..L-1."""
        weights = self.values * self.probabilities
        total = rng.choice(self.values, size=size, p=weights / weights.sum()).astype(np.int64)
        age = np.floor(rng.random(size) * total).astype(np.int64)
        return total, age

"""Which clip a slot plays next: the training catalog shuffled, every clip visited once per pass.

Clips with `clip_id % holdout_every == holdout_every - 1` are held out for evaluation and
never dealt for training (holdout_every = 0 holds out nothing).

**Map locality** (optional, `MapLocality`): clips share maps (a town, an HD map), and a
simulator server keeps its most recently loaded maps cached, so a reset onto a clip of a cached
map skips the load. Given each clip's map and the server each dealt slot lives on, the dealer
prefers, among the clips still due in the current pass, one whose map that server has cached
(its own record of what it dealt there, least to most recent, as the server's LRU cache would
hold them) or was just dealt in the same call, so that a batched reset loads that map once.
The diversity knob `max_repeat` bounds how many clips of one map a server gets while the map
stays cached; past it, the map is no longer preferred until it has left the server's cache.

Fairness does not depend on locality: a pass is a permutation of the training clips, and a
clip is dealt at most once per pass, so at any moment every clip has been dealt as often as
every other, give or take one. Locality changes only the order within a pass.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from broker.pool import SimulatorPool

# The project's split (clips 9, 19, 29, ... held out): the broker's default, what `fast train`
# starts it with, and what its evaluation, the benchmarks and `fast compare` hold out.
HOLDOUT_EVERY = 10
# The map cache a server is assumed to keep when it does not say (the cost model's default).
DEFAULT_CACHE_MAPS = 4


def holdout_clips(num_clips: int, holdout_every: int) -> np.ndarray:
    if holdout_every <= 0:
        return np.zeros(0, dtype=np.int64)
    ids = np.arange(num_clips, dtype=np.int64)
    return ids[ids % holdout_every == holdout_every - 1]


@dataclass(frozen=True)
class MapLocality:
    """Deal clips whose maps a server has cached (module docstring)."""

    clip_map_ids: np.ndarray  # [num_clips] the map of each clip
    cache_maps: dict[int, int]  # server index -> how many maps it caches (DEFAULT_CACHE_MAPS when absent)
    max_repeat: int = 8  # clips of one map a server gets in a row while the map stays cached


def pool_locality(pool: SimulatorPool, max_repeat: int) -> MapLocality | None:
    """Locality over a SimulatorPool's servers (their Describe's clip maps and map cache sizes);
    None when the servers do not say which map each clip plays on."""
    if pool.clip_map_ids.size != pool.num_clips:
        return None
    cache = {
        s.index: int(s.cost_model.map_cache_size) if s.cost_model is not None else DEFAULT_CACHE_MAPS
        for s in pool.servers
    }
    return MapLocality(pool.clip_map_ids, cache, max_repeat=max_repeat)


class ClipDealer:
    def __init__(self, num_clips: int, *, holdout_every: int, seed: int, locality: MapLocality | None = None) -> None:
        held = set(holdout_clips(num_clips, holdout_every).tolist())
        self.train_clips = np.array([c for c in range(num_clips) if c not in held], dtype=np.int64)
        if self.train_clips.size == 0:
            raise ValueError(f"holdout_every={holdout_every} leaves no training clip out of {num_clips}")
        if locality is not None:
            if locality.clip_map_ids.shape != (num_clips,):
                raise ValueError(f"locality needs one map id per clip ({num_clips}); got {locality.clip_map_ids.shape}")
            if locality.max_repeat < 1:
                raise ValueError(f"max_repeat={locality.max_repeat}: a map may repeat at least once (>= 1)")
        self.locality = locality
        self._rng = np.random.default_rng(seed)
        self._order = self._rng.permutation(self.train_clips)
        self._next = 0
        self._episodes = 0
        self._seed = seed
        # Locality's bookkeeping: clips of the pass not dealt yet, by map; per server, the maps it
        # holds (least to most recently dealt) with how many clips of each it got since it entered.
        self._dealt = np.zeros(num_clips, dtype=bool)
        self._due_by_map: dict[int, list[int]] = {}
        self._cached: dict[int, OrderedDict[int, int]] = {}
        if locality is not None:
            self._start_pass_by_map()
        self.clips_dealt: set[int] = set()  # the clips dealt since the caller last cleared it

    def deal(self, count: int, servers: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The next `count` clips and a fresh episode seed for each; `servers[j]` is the server
        the j-th clip will play on (used by map locality, ignored without it)."""
        clips = np.empty(count, dtype=np.int64)
        for j in range(count):
            if self.locality is None or servers is None:
                clips[j] = self._next_in_order()
            else:
                clips[j] = self._next_for(int(servers[j]))
        self.clips_dealt.update(clips.tolist())
        seeds = (self._seed * 1_000_003 + self._episodes + np.arange(count)) & 0x7FFFFFFF
        self._episodes += count
        return clips, seeds.astype(np.int64)

    # -- plain order: the pass's permutation ------------------------------------------------

    def _next_in_order(self) -> int:
        while True:
            if self._next == self._order.size:
                self._new_pass()
            clip = int(self._order[self._next])
            self._next += 1
            if not self._dealt[clip]:  # locality may have dealt it out of order already
                self._take(clip)
                return clip

    def _new_pass(self) -> None:
        self._order = self._rng.permutation(self.train_clips)
        self._next = 0
        self._dealt[:] = False
        if self.locality is not None:
            self._start_pass_by_map()

    def _take(self, clip: int) -> None:
        if self.locality is None:
            return  # the plain dealer deals the permutation in order: nothing to mark
        self._dealt[clip] = True
        due = self._due_by_map[int(self.locality.clip_map_ids[clip])]
        due.remove(clip)

    # -- map locality ------------------------------------------------------------------------

    def _start_pass_by_map(self) -> None:
        self._due_by_map = {}
        for clip in self._order.tolist():  # in the pass's random order
            self._due_by_map.setdefault(int(self.locality.clip_map_ids[clip]), []).append(clip)

    def _next_for(self, server: int) -> int:
        if self._next == self._order.size or not any(self._due_by_map.values()):
            self._new_pass()
        cached = self._cached.setdefault(server, OrderedDict())
        # The most recently dealt cached map with clips still due and repeats left.
        preferred = next(
            (m for m in reversed(cached) if self._due_by_map.get(m) and cached[m] < self.locality.max_repeat), None
        )
        if preferred is None:
            clip = self._fresh_for(cached)
        else:
            clip = self._due_by_map[preferred][0]
            self._take(clip)
        self._remember(server, int(self.locality.clip_map_ids[clip]))
        return clip

    def _fresh_for(self, cached: OrderedDict[int, int]) -> int:
        """The pass's next clip not dealt yet whose map has not used up its repeats on this server
        (most likely a new map); the next one at all when every clip due is of such a map."""
        spent = {m for m, n in cached.items() if n >= self.locality.max_repeat}
        for i in range(self._next, self._order.size):
            clip = int(self._order[i])
            if not self._dealt[clip] and int(self.locality.clip_map_ids[clip]) not in spent:
                if i == self._next:
                    self._next += 1
                self._take(clip)
                return clip
        return self._next_in_order()

    def _remember(self, server: int, map_id: int) -> None:
        cached = self._cached[server]
        size = self.locality.cache_maps.get(server, DEFAULT_CACHE_MAPS)
        if map_id in cached:
            cached[map_id] += 1
            cached.move_to_end(map_id)
            return
        if size <= 0:
            return
        cached[map_id] = 1
        while len(cached) > size:
            cached.popitem(last=False)

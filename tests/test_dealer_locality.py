"""The clip dealer's map locality: more cache hits, one map per batched reset, and every clip
still dealt as often as the others (broker/dealer.py)."""

from __future__ import annotations

from collections import Counter, OrderedDict

import numpy as np
import pytest

from broker.dealer import ClipDealer, MapLocality
from sim_server.cost_model import remember_maps

NUM_CLIPS, NUM_MAPS = 200, 20
MAPS = np.random.default_rng(0).integers(0, NUM_MAPS, NUM_CLIPS)  # any assignment of maps to clips


def _dealer(*, locality: bool, max_repeat: int = 8, seed: int = 1) -> ClipDealer:
    where = MapLocality(MAPS, {0: 4, 1: 4}, max_repeat=max_repeat) if locality else None
    return ClipDealer(NUM_CLIPS, holdout_every=10, seed=seed, locality=where)


def _replay(dealer: ClipDealer, calls: int, per_call: int) -> tuple[float, Counter]:
    """Batched resets of `per_call` slots alternating over 2 servers, each with an LRU map cache of 4
    (the cost model's own rule); returns the cache hit rate and how often each clip was dealt."""
    caches = {0: OrderedDict(), 1: OrderedDict()}
    hits = slots = 0
    dealt: Counter = Counter()
    for call in range(calls):
        server = call % 2
        clips, _ = dealer.deal(per_call, np.full(per_call, server))
        maps = MAPS[clips].tolist()
        seen: set[int] = set()
        for m in maps:
            hits += m in caches[server] or m in seen
            seen.add(m)
        slots += len(maps)
        remember_maps(caches[server], maps, 4)
        dealt.update(clips.tolist())
    return hits / slots, dealt


def test_locality_raises_the_cache_hit_rate_of_batched_and_single_resets() -> None:
    for per_call in (1, 5):
        plain, _ = _replay(_dealer(locality=False), 360, per_call)
        local, _ = _replay(_dealer(locality=True), 360, per_call)
        assert local > plain + 0.3, (per_call, plain, local)


def test_every_clip_is_dealt_as_often_as_the_others_at_any_moment() -> None:
    dealer = _dealer(locality=True, max_repeat=100)
    train = set(dealer.train_clips.tolist())
    total: Counter = Counter()
    for _ in range(50):
        _, dealt = _replay(dealer, 7, 3)  # 21 clips a time: passes end mid-call
        total.update(dealt)
        counts = [total[c] for c in train]
        assert max(counts) - min(counts) <= 1
    assert set(total) == train  # never a held-out clip (c % 10 == 9)


def test_max_repeat_bounds_how_many_clips_of_a_map_a_server_gets_in_a_row() -> None:
    for max_repeat in (1, 3):
        dealer = _dealer(locality=True, max_repeat=max_repeat)
        clips, _ = dealer.deal(60, np.zeros(60, dtype=np.int64))
        maps = MAPS[clips].tolist()
        runs, run = [], 1
        for a, b in zip(maps, maps[1:]):
            run = run + 1 if a == b else 1
            runs.append(run)
        assert max(runs) <= max_repeat


def test_without_servers_or_locality_the_deal_is_the_plain_shuffle() -> None:
    plain = ClipDealer(NUM_CLIPS, holdout_every=10, seed=4).deal(400)
    unplaced = _dealer(locality=True, seed=4).deal(400)
    np.testing.assert_array_equal(plain[0], unplaced[0])
    np.testing.assert_array_equal(plain[1], unplaced[1])


def test_locality_is_deterministic_and_reports_the_clips_it_dealt() -> None:
    a, b = _dealer(locality=True), _dealer(locality=True)
    servers = np.array([0, 1, 0, 1, 1])
    for _ in range(30):
        np.testing.assert_array_equal(a.deal(5, servers)[0], b.deal(5, servers)[0])
    clips, _ = a.deal(5, servers)
    a.clips_dealt.clear()
    clips, _ = a.deal(5, servers)
    assert a.clips_dealt == set(clips.tolist())


def test_bad_locality_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="one map id per clip"):
        ClipDealer(10, holdout_every=0, seed=0, locality=MapLocality(np.zeros(3, dtype=np.int64), {}))
    with pytest.raises(ValueError, match="max_repeat=0"):
        ClipDealer(10, holdout_every=0, seed=0, locality=MapLocality(np.zeros(10, dtype=np.int64), {}, max_repeat=0))


def test_pool_locality_takes_the_servers_maps_and_cache_sizes() -> None:
    from types import SimpleNamespace

    from broker.dealer import DEFAULT_CACHE_MAPS, pool_locality
    from fast.v1 import simulator_pb2 as pb

    servers = [
        SimpleNamespace(index=0, cost_model=pb.CostModel(map_cache_size=6)),
        SimpleNamespace(index=1, cost_model=None),
    ]
    pool = SimpleNamespace(clip_map_ids=MAPS, num_clips=NUM_CLIPS, servers=servers)
    where = pool_locality(pool, max_repeat=3)
    assert where.cache_maps == {0: 6, 1: DEFAULT_CACHE_MAPS} and where.max_repeat == 3
    unlisted = SimpleNamespace(clip_map_ids=np.zeros(0, dtype=np.int64), num_clips=NUM_CLIPS, servers=servers)
    assert pool_locality(unlisted, max_repeat=3) is None  # the servers did not say: no locality

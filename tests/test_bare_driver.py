"""The bare driver (benchmarks/tools/bare_driver.py): real simulator server processes, stepped by a loop
that does nothing else, as the broker's overhead benchmark measures them."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from conftest import sim_server  # as the other tests import it: `tests.conftest` would run it twice (a new token)

from benchmarks.tools.bare_driver import fixed_actions, run_bare
from fast.spaces import SpaceSpec


@pytest.mark.timeout(120)
def test_the_bare_driver_steps_every_server_and_leaves_its_resets_out() -> None:
    # Servers alike, as the benchmark's are: with one faster, the bare driver (which never waits for
    # the slower) could beat the lock-step ideal, which takes each row at its slowest server.
    with (
        sim_server("--slots", "3", "--cost-preset", "step-only") as a,
        sim_server("--slots", "3", "--cost-preset", "step-only") as b,
    ):
        result = asyncio.run(run_bare([a.address, b.address], 40, rows_per_reset=10))
    assert (result.servers, result.slots, result.rows) == (2, 6, 40)
    # Each server resets its slots every 10 rows at least (earlier when half of them ended).
    assert result.resets >= 2 * 3
    # Per row, the slower server's own time: step-only servers emulate 1.6 ms a step.
    assert 0.0015 <= result.latency_s < 0.1
    assert result.ideal == pytest.approx(6 / result.latency_s)
    # A closed loop never beats its servers' own time (a little slack for the servers' clock). The
    # lock-step ideal is no bound here: a hiccup of each server in a different row counts twice in it
    # (a CI run under load measured 1.39 of it), once in the drivers that never wait for each other.
    assert 0 < result.raw <= 1.05 * result.servers_ideal
    assert result.servers_ideal >= result.ideal * (1 - 1e-9)
    assert result.driver_cpu_s > 0


def test_the_bare_driver_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="addresses is empty"):
        asyncio.run(run_bare([], 10))
    with pytest.raises(ValueError, match="rows and rows_per_reset must be at least 1"):
        asyncio.run(run_bare(["127.0.0.1:1"], 0))
    with sim_server("--slots", "1", "--no-local-step") as server:
        with pytest.raises(ValueError, match="names no local step socket"):
            asyncio.run(run_bare([server.address], 5))


def test_fixed_actions_lie_inside_the_space() -> None:
    box = SpaceSpec("box", (3,), np.dtype(np.float32), np.array([-1.0, 0.0, -np.inf]), np.array([3.0, np.inf, np.inf]))
    actions = fixed_actions(box, 2)
    assert actions.shape == (2, 3) and actions.dtype == np.float32
    # The midpoint where both bounds are finite, else 0 kept inside the bounds.
    assert actions.tolist() == [[1.0, 0.0, 0.0]] * 2
    ints = SpaceSpec("box", (2,), np.dtype(np.int64), np.array([2, -4]), np.array([6, -2]))
    assert fixed_actions(ints, 1).tolist() == [[4, -3]]
    discrete = fixed_actions(SpaceSpec("discrete", (), np.dtype(np.int64), n=5), 4)
    assert discrete.tolist() == [0, 0, 0, 0] and discrete.dtype == np.int64

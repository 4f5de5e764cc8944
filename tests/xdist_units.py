"""How pytest-xdist's workers share the suite (`python3 dev.py test` runs `pytest -n 4`; docs/testing.md).

A test module goes to one worker whole and runs there in file order: its module-scoped fixtures
(started servers and stacks that its tests only read) start once, not once per worker, and tests
that build on each other (tests/test_gateway_live.py steers one run step by step) keep their order.
The modules in SPREAD share nothing between their tests, each of which starts processes of its own
for tens of seconds: their tests are dealt one at a time, and first, so the longest start early and
the run does not wait on one worker at its end.

This is xdist's `loadscope` with a different scope for SPREAD. (xdist's own `loadgroup` does not
group under pytest 9.2: it renames node ids, which pytest 9.2 no longer lets it do,
pytest-dev/pytest-xdist#1386.) An explicit `--dist` on the command line still wins.
"""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

SPREAD = frozenset(
    {
        "test_bench.py",
        "test_broker_faults.py",
        "test_broker_service.py",
        "test_carry.py",
        "test_learner_ranks.py",
        "test_loop_floor.py",
        "test_pipelined_rounds.py",
        "test_reproducible.py",
        "test_train.py",
    }
)


# Modules whose one unit outlasts most others (minutes): dealt before everything else, whole, so
# that no worker starts one of them near the end. The container test builds an image and runs a
# Compose stack for 4 to 7 minutes (it skips in a second where containers cannot run).
FIRST = ("test_deploy_containers.py",)


SHARED = ("package", "module", "class")  # session fixtures are per worker whatever the units


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _spread(nodeid: str) -> bool:
    return PurePosixPath(_module(nodeid)).name in SPREAD


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """SPREAD holds only modules whose tests share no module-scoped fixture (each worker would start its own)."""
    for item in items:
        fixtures = getattr(item, "_fixtureinfo", None)
        if fixtures is None or not _spread(item.nodeid):
            continue
        shared = sorted(n for n, defs in fixtures.name2fixturedefs.items() if any(d.scope in SHARED for d in defs))
        if shared:
            raise pytest.UsageError(f"{item.nodeid} shares {shared}: take its module out of SPREAD in {__file__}")


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # pytest-xdist is in the dev extras; without it the suite runs serially
    LoadScopeScheduling = None

if LoadScopeScheduling is not None:

    class ModuleScheduling(LoadScopeScheduling):
        """A module per work unit, but a test per unit in SPREAD's modules; FIRST's modules, then
        SPREAD's units, then the other modules, largest first."""

        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return nodeid if _spread(nodeid) else _module(nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self._ordered:  # the queue is full now, largest module first (loadscope's order)
                for scope in [s for s in self.workqueue if not _spread(s)]:
                    self.workqueue.move_to_end(scope)
                for scope in [s for s in self.workqueue if PurePosixPath(s).name in FIRST]:
                    self.workqueue.move_to_end(scope, last=False)
                self._ordered = True
            super()._assign_work_unit(node)

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_xdist_make_scheduler(config: pytest.Config, log):
        given = any(a in ("-d", "--dist") or a.startswith("--dist=") for a in config.invocation_params.args)
        if config.getvalue("dist") == "load" and not given:  # `-n N` alone
            return ModuleScheduling(config, log)
        return None

"""CPU seconds per test, for deciding where the suite's time goes (docs/testing.md, "How long").

The suite is bound by the machine's CPU, not by waits: its wall time is about its CPU time over
the cores, so the tests to make cheaper are those that burn the most CPU, which --durations
(wall time, inflated by whatever else runs) does not tell. As a plugin:

    PYTHONPATH=tests python3 dev.py test -p cpu_report

each worker writes, per test, the CPU seconds of its own process and of the child processes
reaped during the test (setup, call and teardown: the services a test starts and stops; a
module fixture's processes count at the test whose teardown stops them) to
.pytest-cpu/<pid>.json. Then `python tests/cpu_report.py` prints the totals and the costliest
modules and tests.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
from pathlib import Path

import pytest

FOLDER = Path(".pytest-cpu")
_rows: list[tuple[str, float, float]] = []


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before = _cpu()
    yield
    after = _cpu()
    _rows.append((item.nodeid, round(after[0] - before[0], 3), round(after[1] - before[1], 3)))


def pytest_sessionfinish(session) -> None:
    if _rows:
        FOLDER.mkdir(exist_ok=True)
        (FOLDER / f"{os.getpid()}.json").write_text(json.dumps(_rows))


def main(top: int = 15) -> None:
    rows = [row for path in FOLDER.glob("*.json") for row in json.loads(path.read_text())]
    if not rows:
        sys.exit(f"nothing in {FOLDER}/: run the suite with `-p cpu_report` first")
    total = sum(own + children for _, own, children in rows)
    print(f"{len(rows)} tests, {total:.0f} CPU seconds ({total / 60:.1f} CPU minutes)")
    modules: collections.Counter[str] = collections.Counter()
    for nodeid, own, children in rows:
        modules[nodeid.split("::")[0]] += own + children
    print("\ncostliest modules:")
    for module, seconds in modules.most_common(top):
        print(f"{seconds:8.1f} s  {module}")
    print("\ncostliest tests:")
    for nodeid, own, children in sorted(rows, key=lambda r: -(r[1] + r[2]))[:top]:
        print(f"{own + children:8.1f} s  {nodeid}")


if __name__ == "__main__":
    main()

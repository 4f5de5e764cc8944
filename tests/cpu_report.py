"""CPU seconds per test, for deciding where the suite's time goes (docs/testing.md, "How long").

The suite is bound by the machine's CPU, not by waits: its wall time is about its CPU time over
the cores, so the tests to make cheaper are those that burn the most CPU, which --durations
(wall time, inflated by whatever else runs) does not tell. As a plugin:

    PYTHONPATH=tests python3 dev.py test -p cpu_report

each worker writes, per test, the CPU seconds of its own process and of the child processes
reaped during the test (setup, call and teardown: the services a test starts and stops; a
module fixture's processes count at the test whose teardown stops them) to
.pytest-cpu/<pid>.json. Then `python tests/cpu_report.py` prints the totals and the costliest
modules and tests, and how the workers' time was spent: each worker's busy span and the tests still
running in the last minutes (the suite's tail, which more CPU alone does not shorten).
"""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
import time
from pathlib import Path

import pytest

FOLDER = Path(".pytest-cpu")
_rows: list[tuple[str, float, float, float, float]] = []  # test, own CPU s, children's CPU s, wall start, end


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before, started = _cpu(), time.time()
    yield
    after = _cpu()
    own, children = round(after[0] - before[0], 3), round(after[1] - before[1], 3)
    _rows.append((item.nodeid, own, children, round(started, 3), round(time.time(), 3)))


def pytest_sessionfinish(session) -> None:
    if _rows:
        FOLDER.mkdir(exist_ok=True)
        (FOLDER / f"{os.getpid()}.json").write_text(json.dumps(_rows))


def main(top: int = 15) -> None:
    workers = {path.stem: json.loads(path.read_text()) for path in FOLDER.glob("*.json")}
    rows = [row[:3] for rows_ in workers.values() for row in rows_]
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
    timed = {pid: rows_ for pid, rows_ in workers.items() if rows_ and len(rows_[0]) == 5}
    if timed:
        _timeline(timed, top)


def _timeline(workers: dict[str, list], top: int) -> None:
    """Each worker's span and share of it in tests, and the tests that ran in the suite's last minutes."""
    start = min(row[3] for rows in workers.values() for row in rows)
    end = max(row[4] for rows in workers.values() for row in rows)
    print(f"\nwall: {end - start:.0f} s from the first test's start to the last one's end")
    for pid, rows in sorted(workers.items(), key=lambda kv: max(r[4] for r in kv[1])):
        busy = sum(r[4] - r[3] for r in rows)
        last = max(r[4] for r in rows)
        print(f"  worker {pid}: {len(rows)} tests, {busy:.0f} s in tests, done at {last - start:.0f} s")
    tail = sorted((r for rows in workers.values() for r in rows), key=lambda r: -r[4])
    print("\nthe last tests to end (end s, wall s, CPU s):")
    for nodeid, own, children, began, ended in tail[:top]:
        print(f"  {ended - start:6.0f} {ended - began:6.1f} {own + children:6.1f}  {nodeid}")


if __name__ == "__main__":
    main()

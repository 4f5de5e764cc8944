"""A broker whose learner resumed from a checkpoint: its metrics.jsonl and its held iterations lose the
lines past the checkpoint's version, and it numbers on from the lines kept (broker/metrics_file.py, the
rule `fast train`'s group restart shares; broker/run.py's _resume). Exact cases, no sockets."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.history import MetricsHistory
from broker.metrics_file import Cut, cut_file, cut_lines, drop_lines_from, recorded_versions
from broker.run import BrokerRun


def _line(version: int, iteration: int | None = None) -> str:
    return json.dumps({"iteration": version + 1 if iteration is None else iteration, "policy_version": version}) + "\n"


def _text(versions: list[int]) -> str:
    return "".join(_line(v) for v in versions)


# -- the rule on a file's text -------------------------------------------------------------------


def test_cut_lines_keeps_the_versions_below_the_resumed_one() -> None:
    cut = cut_lines(_text([0, 1, 2, 3, 4, 5]), 4)
    assert (cut.text, cut.kept, cut.dropped, cut.first_missing) == (_text([0, 1, 2, 3]), 4, 2, 4)


def test_cut_lines_drops_a_partial_last_line_and_unreadable_ones() -> None:
    text = _text([0, 1]) + "not json\n" + _line(2) + '{"iteration": 4, "policy_ver'
    cut = cut_lines(text, 3)
    assert (cut.text, cut.kept, cut.dropped, cut.first_missing) == (_text([0, 1, 2]), 3, 2, 3)


def test_cut_lines_at_version_zero_keeps_nothing() -> None:
    """A learner that restarted with no checkpoint starts afresh at version 0: every line is redone."""
    assert cut_lines(_text([0, 1, 2]), 0) == Cut(text="", kept=0, dropped=3, first_missing=0)


def test_cut_lines_reports_a_version_the_kept_lines_lack() -> None:
    """Version 2's line was never written (the answer of update 2 -> 3 lost): the kept lines stop at 2."""
    cut = cut_lines(_text([0, 1, 3, 4]), 5)
    assert (cut.kept, cut.dropped, cut.first_missing) == (4, 0, 2)


def test_cut_file_rewrites_the_file_and_leaves_no_file_alone(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    assert cut_file(path, 3) is None and drop_lines_from(path, 3) == 0 and not path.exists()
    path.write_text(_text([0, 1, 2, 3, 4]))
    assert drop_lines_from(path, 3) == 2
    assert recorded_versions(path) == [0, 1, 2]
    assert drop_lines_from(path, 3) == 0 and path.read_text() == _text([0, 1, 2])


# -- the held iterations -------------------------------------------------------------------------


def _held(history: MetricsHistory) -> list[tuple[int, int]]:
    return [(m["iteration"], m["policy_version"]) for m in history.since(0)]


def test_history_drops_its_tail_from_a_version_and_a_watcher_follows_the_redone_iterations() -> None:
    async def go():
        history = MetricsHistory()
        for v in range(6):
            history.append({"iteration": v + 1, "policy_version": v})
        seen = []

        async def watch():
            async for metrics in history.follow(0):
                seen.append((metrics["iteration"], metrics["policy_version"]))

        watcher = asyncio.ensure_future(watch())
        await asyncio.sleep(0)
        assert history.drop_from_version(4) == 2
        assert _held(history) == [(1, 0), (2, 1), (3, 2), (4, 3)]
        for v in (4, 5, 6):  # trained again from the checkpoint of version 4
            history.append({"iteration": v + 1, "policy_version": v})
            await asyncio.sleep(0)
        history.close()
        await watcher
        return history, seen

    history, seen = asyncio.run(go())
    assert _held(history) == [(v + 1, v) for v in range(7)]
    # The watcher saw 1..6 before the drop, then each redone iteration, in order.
    assert seen == [(v + 1, v) for v in range(6)] + [(5, 4), (6, 5), (7, 6)]
    assert MetricsHistory().drop_from_version(0) == 0


# -- the broker ----------------------------------------------------------------------------------


@asynccontextmanager
async def broker_run(run_dir: Path | None, **settings):
    """A run that is never started (its learner channel opens lazily and is closed on exit)."""
    config = BrokerConfig(simulators=["10.0.0.1:1"], learner="127.0.0.1:1", run_dir=str(run_dir or ""), **settings)
    run = BrokerRun(config)
    try:
        yield run
    finally:
        await run.pool.close()
        await run.learner.close()


def _resume(
    run_dir: Path | None, version: int, *, starting: bool, held: list[int] = (), iteration: int = 0, **settings
):
    async def go():
        async with broker_run(run_dir, **settings) as run:
            if not starting:
                run.iteration = iteration
            for v in held:
                run.history.append({"iteration": v + 1, "policy_version": v})
            run._resume(version, starting=starting)
            return run.iteration, _held(run.history)

    return asyncio.run(go())


def test_a_restarted_broker_drops_the_lines_past_its_learners_version_and_numbers_on(tmp_path: Path) -> None:
    """Restarted by its platform after its learner resumed from the checkpoint of version 4."""
    (tmp_path / "metrics.jsonl").write_text(_text([0, 1, 2, 3, 4, 5]) + '{"iter')
    iteration, _ = _resume(tmp_path, 4, starting=True)
    assert iteration == 4  # its next line: iteration 5, policy version 4
    assert recorded_versions(tmp_path / "metrics.jsonl") == [0, 1, 2, 3]


def test_a_restarted_broker_whose_learner_is_ahead_keeps_every_line(tmp_path: Path) -> None:
    """Only the broker died: its learner kept every update, so every line stays and it numbers on."""
    (tmp_path / "metrics.jsonl").write_text(_text([0, 1, 2]))
    assert _resume(tmp_path, 3, starting=True) == (3, [])
    assert (tmp_path / "metrics.jsonl").read_text() == _text([0, 1, 2])


def test_fast_trains_first_iteration_is_kept_at_a_start(tmp_path: Path) -> None:
    """`fast train` has cut the file already and gives the checkpoint's version as first_iteration."""
    (tmp_path / "metrics.jsonl").write_text(_text([0, 1, 2, 3]))
    assert _resume(tmp_path, 4, starting=True, first_iteration=4) == (4, [])
    (tmp_path / "metrics.jsonl").write_text("")  # a broker whose lines were all dropped (none written yet)
    assert _resume(tmp_path, 4, starting=True, first_iteration=4) == (4, [])


def test_a_running_broker_whose_learner_restarted_older_rewinds_file_and_history(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(_text([0, 1, 2, 3, 4, 5, 6]))
    iteration, held = _resume(tmp_path, 4, starting=False, held=list(range(7)), iteration=7)
    assert iteration == 4 and held == [(v + 1, v) for v in range(4)]
    assert recorded_versions(tmp_path / "metrics.jsonl") == [0, 1, 2, 3]


def test_a_running_broker_without_a_run_dir_rewinds_its_count_by_the_iterations_dropped() -> None:
    iteration, held = _resume(None, 2, starting=False, held=[0, 1, 2, 3], iteration=4)
    assert iteration == 2 and held == [(1, 0), (2, 1)]


@pytest.mark.parametrize("version", [0, 3])
def test_the_resumed_line_numbers_follow_on(tmp_path: Path, version: int) -> None:
    """After the cut, the next line a broker writes is iteration = version + 1 (a group's lockstep)."""
    (tmp_path / "metrics.jsonl").write_text(_text(list(range(5))))
    iteration, _ = _resume(tmp_path, version, starting=True)
    assert iteration == version and consecutive(tmp_path / "metrics.jsonl") == version


def consecutive(path: Path) -> int:
    versions = recorded_versions(path)
    assert versions == list(range(len(versions)))
    return len(versions)

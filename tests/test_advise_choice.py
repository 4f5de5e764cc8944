"""`fast advise`'s recommendation from its ranking and its validation (jobs/advise/choice.py)."""

from __future__ import annotations

import pytest

from jobs.advise.choice import choose

ROWS = [{"label": "ver+prefetch"}, {"label": "fast+carry"}, {"label": "autoreset"}]


def _validated(*measured: float) -> list[dict]:
    return [{"label": row["label"], "measured_effective_throughput": m} for row, m in zip(ROWS, measured)]


def test_without_validation_the_models_first_is_recommended() -> None:
    choice = choose(ROWS, [])
    assert (choice.row, choice.by) == (ROWS[0], "model") and "not validated" in choice.reason


def test_the_models_first_stands_when_measured_the_faster() -> None:
    choice = choose(ROWS, _validated(2000, 1500))
    assert (choice.row, choice.by) == (ROWS[0], "model") and "the faster of the 2" in choice.reason
    assert choose(ROWS, _validated(2000)).row == ROWS[0]


@pytest.mark.parametrize("second", [2000.0, 2100.0, 2200.0])  # up to 10% faster: within the margin
def test_a_second_measured_faster_within_the_margin_leaves_the_models_first(second) -> None:
    choice = choose(ROWS, _validated(2000, second))
    assert (choice.row, choice.by) == (ROWS[0], "model")
    if second > 2000:
        assert "within the 10% margin" in choice.reason and "fast+carry measured" in choice.reason


def test_a_validated_row_past_the_margin_is_recommended() -> None:
    choice = choose(ROWS, _validated(2000, 2300))
    assert (choice.row, choice.by) == (ROWS[1], "validation")
    assert choice.reason == (
        "validated 15% faster than ver+prefetch, the model's first, past the 10% margin (the model put it second)"
    )
    third = choose(ROWS, _validated(2000, 2100, 2600))  # --validate-top 3: the fastest of the three
    assert (third.row, third.by) == (ROWS[2], "validation") and "third" in third.reason
    assert choose(ROWS, _validated(2000, 2300), margin=0.2).row == ROWS[0]


def test_a_first_that_measured_nothing_gives_way() -> None:
    choice = choose(ROWS, _validated(0.0, 10.0))
    assert (choice.row, choice.by) == (ROWS[1], "validation") and "measured nothing valid" in choice.reason


def test_inconsistent_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="no ranking rows"):
        choose([], [])
    with pytest.raises(ValueError, match="does not hold the model's first row 'ver\\+prefetch'"):
        choose(ROWS, [{"label": "fast+carry", "measured_effective_throughput": 1.0}])

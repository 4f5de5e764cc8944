"""`--mode auto` (broker/advisor/auto_mode.py): the chooser on scripted throughput sequences, and the
settings that turn it on. The run that switches end to end is tests/test_auto_alpha.py's `fast train`.
"""

from __future__ import annotations

import typing
from collections.abc import Callable

import pytest

from broker.advisor.auto_mode import AutoMode, ModeChoice
from broker.config import BrokerConfig
from broker.samplers import MODE_NAMES
from broker.settings import RunSettings, SettingError, changes
from gateway.models import ConfigPatch, ModeSetting
from jobs.train.config import TrainConfig

BROKER = {"simulators": ["127.0.0.1:1"], "learner": "127.0.0.1:2"}


def _play(auto: AutoMode, speed: Callable[[int, str], float], iterations: int) -> list[ModeChoice]:
    """`iterations` boundaries: each choice samples one iteration at speed(i, mode) valid transitions/s."""
    played = []
    for i in range(iterations):
        choice = auto.choose()
        played.append(choice)
        auto.observe(choice.mode, valid=round(1000 * speed(i, choice.mode)), wall_s=1.0)
    return played


def _fixed(**speeds: float) -> Callable[[int, str], float]:
    return lambda i, mode: speeds[mode]


def test_it_starts_with_the_first_candidate_then_probes_each_other_once_in_order() -> None:
    played = _play(AutoMode(("fast", "ver", "autoreset"), probe_every=10), _fixed(fast=3, ver=2.5, autoreset=2.4), 5)
    assert [(c.mode, c.source) for c in played] == [
        ("fast", "start"),
        ("ver", "probe"),
        ("autoreset", "probe"),
        ("fast", "stay"),
        ("fast", "stay"),
    ]
    assert played[0].throughput == {"fast": None, "ver": None, "autoreset": None}  # nothing measured yet
    assert played[3].throughput == {"fast": 3000.0, "ver": 2500.0, "autoreset": 2400.0}
    assert played[0].as_dict(1)["next_probe_iteration"] == 2 and played[1].as_dict(2)["next_probe_iteration"] == 3
    assert played[2].probe_in is None  # the round's last probe: decided after it
    assert played[3].as_dict(4) == {
        "mode": "fast",
        "source": "stay",
        "throughput": {"fast": 3000.0, "ver": 2500.0, "autoreset": 2400.0},
        "iterations": {"fast": 1, "ver": 1, "autoreset": 1},
        "probe_every": 10,
        "next_probe_iteration": 14,  # iterations 4..13 in fast: 10 of them
    }


def test_probe_rounds_come_every_probe_every_iterations_and_back_off_while_nothing_switches() -> None:
    played = _play(AutoMode(("fast", "ver"), probe_every=3, max_backoff=4), _fixed(fast=2, ver=1.8), 40)
    probes = [i for i, c in enumerate(played) if c.source == "probe"]
    # The first round at once; then 3 iterations in fast, then 6 (doubled), 12 (the cap, 4 x 3), 12.
    assert probes == [1, 5, 12, 25, 38]
    assert [played[i + 1].probe_every for i in probes[:-1]] == [3, 6, 12, 12]
    assert all(c.mode == "fast" for i, c in enumerate(played) if i not in probes)
    for i in probes[:-1]:  # each decision says when the next round is, and it comes then
        assert played[i + 1].as_dict(i + 2)["next_probe_iteration"] == probes[probes.index(i) + 1] + 1


def test_a_mode_far_behind_is_probed_at_the_longest_interval_and_a_round_probes_only_the_modes_due() -> None:
    # ver at 0.5 of fast: far behind (below 0.75); autoreset at 0.9: probed at the ordinary interval.
    auto = AutoMode(("fast", "ver", "autoreset"), probe_every=3, max_backoff=4)
    played = _play(auto, _fixed(fast=2, ver=1, autoreset=1.8), 40)
    probes = [(i, c.mode) for i, c in enumerate(played) if c.source == "probe"]
    # The first round probes both; then autoreset after 3, 6, 12, 12 iterations in fast; ver after 12.
    assert probes == [(1, "ver"), (2, "autoreset"), (6, "autoreset"), (13, "autoreset"), (17, "ver")] + [
        (27, "autoreset"),
        (31, "ver"),
    ]
    assert all(c.mode == "fast" for c in played if c.source != "probe")
    assert auto.interval("ver") == 12 and auto.interval("autoreset") == 12  # both at the cap by now
    assert played[3].as_dict(4)["next_probe_iteration"] == 7  # the soonest of the two: autoreset's


def test_a_far_mode_comes_back_to_the_ordinary_interval_when_the_mode_in_force_slows_down() -> None:
    # fast at 0.5 of ver until iteration 10; then ver slows to 0.6 of fast's old figure.
    speed = lambda i, mode: {"fast": 1.0, "ver": 2.0}[mode] if i < 10 else {"fast": 1.0, "ver": 0.6}[mode]  # noqa: E731
    auto = AutoMode(("ver", "fast"), probe_every=4, max_backoff=8, window=1)
    played = _play(auto, speed, 20)
    probes = [i for i, c in enumerate(played) if c.source == "probe"]
    assert probes[0] == 1 and played[2].probe_in == 31  # far: 32 iterations in ver, the decision's the first
    # ver's figure is 0.6 from iteration 11 on: fast's (1.0) is no longer far, and 9 iterations are past 4.
    assert probes[1] == 11 and (played[12].mode, played[12].source) == ("fast", "switch")


@pytest.mark.parametrize(("ver", "switches"), [(2.3, True), (2.1, False), (2.0, False)])
def test_it_switches_only_when_an_alternative_beats_the_mode_in_force_by_more_than_the_margin(
    ver: float, switches: bool
) -> None:
    played = _play(AutoMode(("fast", "ver"), probe_every=5, margin=0.1), _fixed(fast=2, ver=ver), 6)
    decision = played[2]
    assert (decision.mode, decision.source) == (("ver", "switch") if switches else ("fast", "stay"))
    assert all(c.mode == decision.mode for c in played[2:])


def test_after_a_switch_the_old_mode_is_probed_and_a_better_one_later_wins_it_back() -> None:
    # ver is faster for the first 10 iterations, then fast is (a learning policy's episodes changed).
    speed = lambda i, mode: {"fast": 2.0, "ver": 3.0}[mode] if i < 10 else {"fast": 3.0, "ver": 1.0}[mode]  # noqa: E731
    played = _play(AutoMode(("fast", "ver"), probe_every=4, window=3), speed, 30)
    assert [(c.mode, c.source) for c in played[:4]] == [
        ("fast", "start"),
        ("ver", "probe"),
        ("ver", "switch"),
        ("ver", "stay"),
    ]
    assert played[2].probe_every == 4  # a switch: the interval stays probe_every
    back = next(i for i, c in enumerate(played) if c.source == "switch" and c.mode == "fast")
    assert back > 10 and all(c.mode == "fast" for c in played[back:] if c.source != "probe")


def test_a_mode_without_a_figure_is_not_compared() -> None:
    auto = AutoMode(("fast", "ver", "autoreset"), probe_every=5)
    for valid, wall in ((3000, 1.0), (0, 0.0), (9000, 1.0)):  # ver's iteration measured nothing
        auto.observe(auto.choose().mode, valid=valid, wall_s=wall)
    decision = auto.choose()
    assert decision.throughput == {"fast": 3000.0, "ver": None, "autoreset": 9000.0}
    assert (decision.mode, decision.source) == ("autoreset", "switch")


def test_with_one_candidate_it_never_probes() -> None:
    played = _play(AutoMode(("ver",), probe_every=1), _fixed(ver=1.0), 8)
    assert [c.source for c in played] == ["start"] + ["stay"] * 7
    assert {c.mode for c in played} == {"ver"} and all(c.probe_in is None for c in played)


def test_turned_on_live_in_a_mode_that_is_no_candidate_it_gives_way_to_the_best_candidate() -> None:
    auto = AutoMode(("fast", "ver"), probe_every=5)
    for _ in range(3):  # figures are kept while auto is off
        auto.observe("sgr", valid=5000, wall_s=1.0)
    auto.take_over("sgr")
    played = _play(auto, _fixed(fast=2, ver=1, sgr=5), 4)
    assert [(c.mode, c.source) for c in played] == [
        ("sgr", "start"),
        ("fast", "probe"),
        ("ver", "probe"),
        ("fast", "switch"),  # sgr is faster, but not a candidate
    ]
    assert played[0].throughput == {"fast": None, "ver": None, "sgr": 5000.0}


def test_the_figure_is_the_windows_valid_transitions_per_second_first_iteration_after_a_switch_included() -> None:
    auto = AutoMode(("fast", "ver"), window=3)
    auto.observe("ver", valid=100, wall_s=1.0, first_after_switch=True)
    for _ in range(3):
        auto.observe("fast", valid=400, wall_s=2.0)
    auto.observe("fast", valid=100, wall_s=2.0, first_after_switch=True)
    assert auto.throughput("ver") == 100.0
    assert auto.throughput("fast") == pytest.approx(900 / 6)  # the last 3 of fast's 4


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"candidates": ("fast", "sgrr")}, "mode_candidates has 'sgrr'"),
        ({"candidates": ()}, "mode_candidates is empty"),
        ({"candidates": ("fast", "fast")}, "lists a mode twice"),
        ({"margin": -0.1}, "margin=-0.1"),
        ({"probe_every": 0}, "probe_every=0"),
        ({"far": 1.5}, "far=1.5"),
    ],
)
def test_bad_arguments_are_named(given: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AutoMode(**given)


# --- the settings ----------------------------------------------------------------------------------


def test_mode_takes_a_name_or_auto_and_the_candidates_a_comma_list() -> None:
    cfg = BrokerConfig(**BROKER, mode="auto", mode_candidates="fast, ver", mode_probe_every=2, mode_margin=0.2)
    assert (cfg.mode, cfg.mode_candidates, cfg.mode_probe_every, cfg.mode_margin) == ("auto", ["fast", "ver"], 2, 0.2)
    assert BrokerConfig(**BROKER).mode_candidates == ["fast", "ver", "autoreset"]
    train = TrainConfig(mode="auto", mode_candidates=["ver", "sgr"], mode_probe_every=3)
    broker = train.broker_config(["127.0.0.1:1"], "127.0.0.1:2", "run", 0)
    assert (broker.mode, broker.mode_candidates, broker.mode_probe_every) == ("auto", ["ver", "sgr"], 3)
    with pytest.raises(ValueError, match="mode_candidates has 'auto'"):
        BrokerConfig(**BROKER, mode_candidates="fast,auto")
    with pytest.raises(ValueError, match="lists a mode twice"):
        TrainConfig(mode_candidates=["ver", "ver"])


def test_mode_auto_is_turned_on_by_auto_and_off_by_a_name() -> None:
    fixed = RunSettings(0.5, 200, 64, mode="fast")
    auto = fixed.updated(mode="auto")
    assert auto == RunSettings(0.5, 200, 64, mode="fast", mode_auto=True)
    ver = auto.updated(mode="ver")
    assert ver == RunSettings(0.5, 200, 64, mode="ver", mode_auto=False)
    assert changes(auto, ver) == [
        {"name": "mode", "old_value": "fast", "new_value": "ver"},
        {"name": "mode_auto", "old_value": True, "new_value": False},
    ]
    with pytest.raises(SettingError, match="mode is 'turbo'; allowed: sc, autoreset, sgr, ver, fast or auto"):
        fixed.updated(mode="turbo")


def test_the_gateway_takes_the_same_modes_and_hands_them_to_update_settings() -> None:
    assert typing.get_args(ModeSetting) == (*MODE_NAMES, "auto")
    assert ConfigPatch(mode="auto").broker_part() == {"mode": "auto"}
    assert ConfigPatch(mode="ver", alpha=0.3).broker_part() == {"alpha": 0.3, "mode": "ver"}
    with pytest.raises(ValueError, match="mode"):
        ConfigPatch(mode="turbo")

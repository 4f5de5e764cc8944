"""`fast advise` (jobs/advise/): its options are AdviseConfig's; a run as a user starts it on the built-in
workload (the JSON's structure, predictions positive and ranked, the best two validated) and on an external
server; bad input refused with the option named, never a traceback."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import typer
from conftest import sim_server
from pydantic import TypeAdapter
from typer.testing import CliRunner

import jobs.cli as cli
from fast.settings import cli_default, flag_name, parse_cli_value
from jobs.advise.config import AdviseConfig

BASE_MODES = {"sc", "autoreset", "sgr", "ver", "fast+carry", "fast+reset"}


def _advise(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fast", "advise", *args], capture_output=True, text=True, timeout=timeout
    )


def _strict(text: str) -> dict:
    """JSON as a strict parser reads it: NaN and Infinity are not JSON."""

    def refuse(constant: str):
        raise AssertionError(f"{constant} in the JSON")

    return json.loads(text, parse_constant=refuse)


def _base(label: str) -> str:
    """fast+carry+locality+prefetch -> fast+carry; ver+prefetch -> ver."""
    parts = label.split("+")
    return "+".join(parts[:2]) if parts[0] == "fast" else parts[0]


# -- the options --------------------------------------------------------------------------------------


def test_every_advise_setting_has_one_option_with_the_models_default_and_help() -> None:
    params = {p.name: p for p in typer.main.get_command(cli.app).commands["advise"].params}
    assert set(params) == {*AdviseConfig.model_fields, "config", "json_path"}
    for name, field in AdviseConfig.model_fields.items():
        param = params[name]
        assert flag_name(name, field) in param.opts, name
        assert field.description, name
        assert param.default == cli_default(field), name
        shown = parse_cli_value(name, field, param.default)
        if shown is not None:
            assert TypeAdapter(field.annotation).validate_python(shown) == field.get_default(), name


# -- bad input: exit 2, the option named, no traceback --------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preset", "fastest"], "preset='fastest': use one of off, calibrated, parallel"),
        (["--clips", "0"], "clips=0: Input should be greater than or equal to 1"),
        (["--simulators", "127.0.0.1:1", "--preset", "parallel"], "--preset does not apply with --simulators"),
        (["--simulators", "no-port-here"], "simulator address 'no-port-here': expected HOST:PORT"),
        (["--checkpoint", "/no/such/dir"], "checkpoint /no/such/dir is not a directory"),
    ],
)
def test_bad_settings_exit_2_naming_the_option(argv: list[str], message: str) -> None:
    result = CliRunner().invoke(cli.app, ["advise", *argv])
    assert result.exit_code == 2, result.output
    assert message in result.output, result.output


def test_an_iterations_samples_grow_with_the_clips_unless_given() -> None:
    """1,024 valid transitions per 10 clips, rounded up: 30 clips get 3,072, not 34 rows' worth."""
    assert [AdviseConfig().samples_for(c) for c in (4, 10, 11, 30)] == [1024, 1024, 2048, 3072]
    assert AdviseConfig(samples=500).samples_for(30) == 500


def test_a_step_costs_at_least_what_the_timed_rows_waited_for() -> None:
    """`_row_slope`: the probe's slope where it is the larger; else the slope through the rows' server time."""
    from broker.advisor.model import SimulatorCosts
    from jobs.advise.run import RowTiming, _row_slope

    costs = SimulatorCosts(step_s=0.3e-3, step_per_slot_s=0.0)
    assert _row_slope(costs, RowTiming(broker_s=0.7e-3, server_s=0.44e-3), 15) == pytest.approx(0.01e-3)
    assert _row_slope(costs, RowTiming(broker_s=0.7e-3, server_s=0.44e-3), 1) == 0.0  # one slot: no slope to fit
    steep = SimulatorCosts(step_s=0.3e-3, step_per_slot_s=0.05e-3)
    assert _row_slope(steep, RowTiming(broker_s=0.7e-3, server_s=0.44e-3), 15) == 0.05e-3
    assert _row_slope(costs, RowTiming(broker_s=0.7e-3, server_s=0.2e-3), 15) == 0.0  # rows faster: never below 0


def test_a_simulator_name_that_does_not_resolve_exits_2_with_a_message() -> None:
    done = _advise("--simulators", "dns:///no-such-simulator.invalid:50051", timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--simulators dns:///no-such-simulator.invalid:50051: the name does not resolve" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow  # jobs/external.py asks a server that does not answer again for 30 s (it may be starting)
def test_an_unreachable_simulator_exits_2_with_a_message() -> None:
    with sim_server("--slots", "1") as server:
        address = server.address
    done = _advise("--simulators", address, timeout=120)  # the port is closed now
    assert done.returncode == 2, done.stderr
    assert f"simulator {address} did not answer Describe" in done.stderr and "Check --simulators" in done.stderr
    assert "Traceback" not in done.stderr


# -- runs as a user starts them -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def advised(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    """`fast advise --json PATH` with the default settings: the built-in workload, calibrated, 10 clips."""
    path = tmp_path_factory.mktemp("advise") / "advise.json"
    done = _advise("--json", str(path))
    assert done.returncode == 0, done.stderr[-3000:]
    return done, _strict(path.read_text())


@pytest.mark.slow
def test_advise_on_the_built_in_workload_finishes_and_validates_two_modes(advised) -> None:
    done, result = advised
    assert "recommended: --mode" in done.stdout and "validated (the real samplers, briefly)" in done.stdout
    assert f"({result['recommended']['label']}: {result['recommended']['reason']})" in done.stdout
    validation = result["validation"]
    assert [v["label"] for v in validation] == [row["label"] for row in result["ranking"][:2]]
    for v in validation:
        # The default 3 measured iterations of 1,024, as the model played them.
        assert v["measured_effective_throughput"] > 0 and v["measured"]["valid_transitions"] >= 3 * 1024
        assert v["ratio"] == pytest.approx(v["measured_effective_throughput"] / v["predicted_effective_throughput"])
        assert f"{v['ratio']:.2f}" in done.stdout
    assert result["wall_s"] > 0 and f"took {result['wall_s']:.1f} s" in done.stdout
    assert result["model_inputs"]["horizon"]["iterations"] == 3


@pytest.mark.slow
def test_advise_json_holds_the_probes_and_every_mode_ranked(advised) -> None:
    _, result = advised
    assert result["workload"]["clips"] == 10 and len(result["workload"]["servers"]) == 2
    assert set(result["probes"]) == {"0", "1"}
    for probe in result["probes"].values():
        # calibrated: 1.6 ms a step. The one-slot Step as the server timed it (a wait is never short); the
        # fit's fixed part is that less a per-slot slope, which a loaded moment inflates (0.67 ms once).
        assert probe["figures"]["step_1"]["median"] > 0.0015 and probe["costs"]["step_s"] > 0
        assert probe["costs"]["map_load_s"] > 0.05  # ... and 123 ms a map load
        assert set(probe["findings"]) == {"reset_exclusive", "loads_shared", "reset_blocks_steps", "prepare_hides_load"}
        assert {"median", "mean", "spread", "n"} <= set(probe["figures"]["step_1"])
    # VER's row of slot loops costs the broker its call and more: its per-slot work is measured, not 0 by default.
    assert result["ver"]["row_s"] > 0 and result["ver"]["slot_s"] >= 0
    # A lock-step row of every server's slots costs each server's Step in the model at least what the rows
    # timed waited for (`_row_slope`), and the broker's part of it is charged to every call.
    k = result["workload"]["slots_per_server"]
    assert result["row_server_s"] > 0.0015 and result["call_s"]["used"] >= result["call_s"]["row"] > 0
    # Of the row's part, the broker thread's own CPU time: measured (the loop does grpc.aio's work), never above it.
    assert 0 < result["row_cpu_s"] <= result["call_s"]["row"]
    # Of a call's thread CPU, the share after its answer woke the loop (wake.py): measured on asyncio's loop.
    for probe in result["probes"].values():
        assert 0 < probe["receive_share"] <= 1 and probe["figures"]["call_receive_cpu"]["n"] > 0
    assert 0 < result["call_receive_cpu_s"] <= result["row_cpu_s"]
    # ... recorded, not played: the model charges a call's whole thread part before it (docs/advisor.md).
    assert result["model_inputs"]["workload"]["call_receive_cpu_s"] == 0
    for probe in result["probes"].values():
        costs = probe["costs"]
        assert costs["step_s"] + (k - 1) * costs["step_per_slot_s"] >= result["row_server_s"] * (1 - 1e-9)
    lengths = result["episode_lengths"]
    assert math.fsum(lengths["probabilities"]) == pytest.approx(1.0) and lengths["mean"] >= 1
    assert result["alpha"]["best"] in [g["alpha"] for g in result["alpha"]["grid"]]

    ranking = result["ranking"]
    assert {_base(row["label"]) for row in ranking} == BASE_MODES and len(ranking) == len(BASE_MODES)
    for rows in (ranking, result["predictions"]):
        throughputs = [row["effective_throughput"] for row in rows]
        assert all(t > 0 for t in throughputs) and throughputs == sorted(throughputs, reverse=True)
        assert all(0 < row["eta"] <= 1 and row["limit"] > 0 for row in rows)
    fast = [row for row in ranking if row["settings"]["mode"] == "fast"]
    assert all(row["settings"]["alpha"] == result["alpha"]["best"] for row in fast)
    # The model's first, unless a validated row measured more than 10% faster (jobs/advise/choice.py).
    recommended, validation = result["recommended"], result["validation"]
    measured = {v["label"]: v["measured_effective_throughput"] for v in validation}
    first = measured[ranking[0]["label"]]
    if recommended["by"] == "model":
        assert recommended["label"] == ranking[0]["label"] and all(m <= 1.1 * first for m in measured.values())
    else:
        assert recommended["by"] == "validation" and measured[recommended["label"]] > 1.1 * first
    row = next(row for row in ranking if row["label"] == recommended["label"])
    assert recommended["prefetch"] == row["settings"]["prefetch"] and recommended["reason"]


# `fast advise --simulators` on a server attached through the protos alone (the Python example), JSON on
# stdout: tests/test_examples.py.

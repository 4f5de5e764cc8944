"""The model's inputs written as JSON and read back (broker/advisor/records.py): the same predictions."""

import json

import numpy as np
import pytest

from broker.advisor.lengths import EpisodeLengths
from broker.advisor.model import Catalog, Horizon, ModeSettings, SimulatorCosts, Workload, predict
from broker.advisor.records import horizon_from_record, horizon_record, workload_from_record, workload_record


def _workload(costs) -> Workload:
    lengths = EpisodeLengths.from_sample([5, 9, 14, 30, 31, 60], censored=[0, 0, 1, 0, 0, 1])
    return Workload(
        lengths,
        costs,
        servers=2,
        slots_per_server=3,
        inference_s=1e-4,
        inference_per_obs_s=2e-6,
        call_s=5e-4,
        ver_slot_s=3e-5,
        round_s=1e-4,
        catalog=Catalog(np.arange(40) % 7, holdout_every=10, locality_max_repeat=4),
    )


@pytest.mark.parametrize(
    "costs",
    [
        SimulatorCosts(step_s=1.6e-3, reset_fixed_s=0.027, map_load_s=0.123, prefetch_step_penalty=0.1),
        (SimulatorCosts(step_s=1e-3, reset_blocks_steps=True), SimulatorCosts(step_s=2e-3, loads_shared=False)),
    ],
    ids=["one-for-all", "per-server"],
)
def test_a_workload_read_back_from_json_predicts_the_same(costs):
    workload, horizon = _workload(costs), Horizon(samples_per_iteration=300, iterations=2, warmup_samples=60)
    text = json.dumps({"workload": workload_record(workload), "horizon": horizon_record(horizon)})
    record = json.loads(text)
    back, back_horizon = workload_from_record(record["workload"]), horizon_from_record(record["horizon"])
    assert back_horizon == horizon
    np.testing.assert_array_equal(back.lengths.values, workload.lengths.values)
    for settings in (ModeSettings("ver", prefetch=True), ModeSettings("fast", alpha=0.4, locality=True)):
        assert predict(back, settings, back_horizon, seed=3) == predict(workload, settings, horizon, seed=3)


def test_a_record_missing_a_part_is_refused_by_name():
    record = workload_record(_workload(SimulatorCosts(step_s=1e-3)))
    del record["lengths"]
    with pytest.raises(ValueError, match="not a workload record: KeyError 'lengths'"):
        workload_from_record(record)


def test_a_record_written_before_a_field_existed_reads_with_its_default():
    record = workload_record(_workload(SimulatorCosts(step_s=1e-3)))
    del record["round_s"]
    assert workload_from_record(record).round_s == 0.0


def test_a_field_of_the_wrong_type_is_refused_not_a_traceback():
    record = workload_record(_workload(SimulatorCosts(step_s=1e-3)))
    record["call_receive_cpu_s"] = "x"  # hand-edited: seconds as text
    with pytest.raises(ValueError, match="not a workload record: TypeError"):
        workload_from_record(record)

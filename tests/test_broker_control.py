"""The broker's run-time control: UpdateSettings, DetachSimulator, metrics history and watching.

First the rules without sockets (fake simulator clients answering Describe, as in
test_broker_pool.py), then the whole API over real gRPC with the services as processes.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
from conftest import Aborted, FakeContext
from test_broker_pool import FakeClient, _description

import broker.pool
from broker.config import BrokerConfig
from broker.metrics_file import whole_lines
from broker.pool import SimulatorPool
from broker.run import BrokerRun, ControlRefused, RunState, UnknownSimulator
from broker.samplers import make_sampler
from broker.servicer import BrokerServicer
from broker.settings import RunSettings, SettingError
from broker.wire import metrics_from_proto
from fast.rpc import open_blocking_channel
from fast.v1 import broker_pb2 as pb
from fast.v1 import broker_pb2_grpc as pb_grpc
from jobs.processes import start_service

# -- the rules, without sockets ------------------------------------------------------------------


@pytest.fixture()
def fake_simulators(monkeypatch) -> None:
    """Any address answers Describe like a takeover server of 3 slots."""
    monkeypatch.setattr(broker.pool, "SimulatorClient", lambda address, **_: FakeClient(_description()))


@asynccontextmanager
async def broker_run():
    """A run that is never started (its learner channel opens lazily and is closed on exit)."""
    run = BrokerRun(BrokerConfig(simulators=["10.0.0.1:1"], learner="127.0.0.1:1", alpha=0.5, t_max=200))
    try:
        yield run
    finally:
        await run.pool.close()
        await run.learner.close()


def test_pool_remove_renumbers_slots_and_servers(fake_simulators) -> None:
    async def go():
        pool = SimulatorPool()
        for address in ("10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"):
            await pool.add(address)
        with pytest.raises(KeyError):
            await pool.remove("10.0.0.9:1")
        removed = await pool.remove("10.0.0.2:1")
        await pool.add("10.0.0.2:1")  # back, at the end
        return pool, removed

    pool, removed = asyncio.run(go())
    assert removed.address == "10.0.0.2:1"
    assert [s.address for s in pool.servers] == ["10.0.0.1:1", "10.0.0.3:1", "10.0.0.2:1"]
    assert [(s.index, s.slot_offset) for s in pool.servers] == [(0, 0), (1, 3), (2, 6)]
    assert pool.slot_server.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert pool.slot_local.tolist() == [0, 1, 2] * 3
    for slot in range(pool.num_slots):  # every global slot maps back to itself through its server
        server = pool.servers[pool.slot_server[slot]]
        assert server.slot_offset + pool.slot_local[slot] == slot


def test_detach_rules(fake_simulators) -> None:
    async def go():
        async with broker_run() as run:
            for address in ("10.0.0.1:1", "10.0.0.2:1"):
                await run.pool.add(address)
            refusals = []
            for address in ("10.0.0.9:1", "x" * 500):
                with pytest.raises(UnknownSimulator) as unknown:
                    run.detach(address)
                refusals.append(str(unknown.value))
            assert run.detach("10.0.0.1:1").draining and run.active_slots == 3
            assert run.detach("10.0.0.1:1").draining  # again: still draining, no error
            with pytest.raises(ControlRefused) as last:
                run.detach("10.0.0.2:1")
            refusals.append(str(last.value))
            await run._between_iterations()
            left = [s.address for s in run.pool.servers]
            run.register("10.0.0.1:1")
            await run._between_iterations()
            back = [(s.address, s.index, s.draining) for s in run.pool.servers]
            return refusals, left, back, run.active_slots, run._sampler.slots.tolist()

    refusals, left, back, slots, sampled = asyncio.run(go())
    assert refusals[0].startswith("simulator '10.0.0.9:1' is not attached")
    assert len(refusals[1]) < 200  # the address is quoted, bounded
    assert "'10.0.0.2:1' is the last one left" in refusals[2]
    assert left == ["10.0.0.2:1"]
    assert back == [("10.0.0.2:1", 0, False), ("10.0.0.1:1", 1, False)] and slots == 6
    assert sampled == list(range(6))  # the sampler was rebuilt over the new numbering


def test_update_settings_pending_until_the_boundary(fake_simulators) -> None:
    class Recorder:
        def apply_settings(self, **settings) -> None:
            self.applied = settings

    async def go():
        async with broker_run() as run:
            run._sampler = Recorder()
            settings, effective = run.update_settings(alpha=0.8)
            assert (settings, effective) == (RunSettings(0.8, 200, 2048), 1)
            settings, _ = run.update_settings(samples_per_iteration=100)  # adds up with the first
            assert settings == RunSettings(0.8, 200, 100) and run.settings == RunSettings(0.5, 200, 2048)
            with pytest.raises(SettingError, match="t_max is 0"):
                run.update_settings(t_max=0)
            await run._between_iterations()
            assert run.settings == RunSettings(0.8, 200, 100) and run.pending_settings is None
            assert run._sampler.applied == {"samples_per_iteration": 100, "alpha": 0.8, "t_max": 200}
            _, effective = run.update_settings(t_max=50)  # an iteration is in flight: from the one after
            assert effective == 2
            return run._unreported_changes

    assert asyncio.run(go()) == [
        {"name": "alpha", "old_value": 0.5, "new_value": 0.8},
        {"name": "samples_per_iteration", "old_value": 2048, "new_value": 100},
    ]


@pytest.mark.parametrize("mode", ["fast", "sc", "ver"])
def test_samplers_take_new_settings_in_place(fake_simulators, mode: str) -> None:
    async def go():
        pool = SimulatorPool()
        await pool.add("10.0.0.1:1")
        sampler = make_sampler(
            mode, pool, None, None, samples_per_iteration=64, alpha=0.5, t_max=200, truncation="reset"
        )
        live = sampler.live
        live[:] = True  # an episode in flight must survive the change
        sampler.apply_settings(samples_per_iteration=100, alpha=0.9, t_max=30)
        return sampler, live

    sampler, live = asyncio.run(go())
    assert sampler.samples_per_iteration == 100 and sampler.live is live and live.all()
    if mode == "fast":  # the truncation is the run's, not a live setting: it stays
        assert (sampler.rule.alpha, sampler.rule.t_max, sampler.rule.truncation) == (0.9, 30, "reset")


def test_state_reads_paused_until_resumed_and_control_is_refused_once_over(fake_simulators) -> None:
    async def go():
        async with broker_run() as run:
            run._state = RunState.RUNNING
            run.pause()
            states = [run.state]
            run.resume()
            states.append(run.state)
            run.fail("over for the test")
            with pytest.raises(ControlRefused, match="the run is failed"):
                run.update_settings(alpha=1.0)
            with pytest.raises(ControlRefused, match="the run is failed"):
                run.detach("10.0.0.1:1")
            return states

    assert asyncio.run(go()) == [RunState.PAUSED, RunState.RUNNING]


def test_servicer_errors_and_watchers_that_go_away(fake_simulators) -> None:
    async def go():
        async with broker_run() as run:
            servicer = BrokerServicer(run)
            codes = []
            for call, request in [
                (servicer.GetMetricsHistory, pb.GetMetricsHistoryRequest(max_count=-1)),
                (servicer.UpdateSettings, pb.UpdateSettingsRequest()),
                (servicer.UpdateSettings, pb.UpdateSettingsRequest(alpha=2.0)),
                (servicer.DetachSimulator, pb.DetachSimulatorRequest(address="10.0.0.9:1")),
                (servicer.DetachSimulator, pb.DetachSimulatorRequest()),
            ]:
                with pytest.raises(Aborted) as aborted:
                    await call(request, FakeContext())
                codes.append((aborted.value.code, aborted.value.details))

            async def watch() -> None:
                async for _ in servicer.WatchMetrics(pb.WatchMetricsRequest(), FakeContext()):
                    pass

            task = asyncio.create_task(watch())
            await asyncio.sleep(0.01)
            watching = run.history.watchers
            task.cancel()  # what gRPC does when the client goes away
            await asyncio.gather(task, return_exceptions=True)
            return codes, watching, run.history.watchers

    codes, watching, left = asyncio.run(go())
    assert [c for c, _ in codes] == [
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT,
    ]
    assert codes[0][1].startswith("max_count is -1")
    assert "no setting given" in codes[1][1] and "alpha is 2.0" in codes[2][1]
    assert "'10.0.0.9:1' is not attached" in codes[3][1]
    assert (watching, left) == (1, 0)


# -- over gRPC, with the services as processes -----------------------------------------------------


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _lines(run_dir: Path) -> dict[int, dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return {}
    whole, _ = whole_lines(path.read_text())  # the broker may be mid-way through its next line
    return {m["iteration"]: m for m in (json.loads(line) for line, _ in whole)}


def _same(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Two takeover simulator servers (2 and 3 slots) and a learner, for the brokers of this module."""
    checkpoints = tmp_path_factory.mktemp("ckpt")
    services = []
    try:
        for name, slots in (("sim-a", "2"), ("sim-b", "3")):
            services.append(start_service(name, ["sim-server", "--slots", slots, "--port", "0"]))
        learner_args = ["learner", "--port", "0", "--checkpoint-dir", str(checkpoints)]
        services.append(start_service("learner", [*learner_args, "--update-epochs", "1", "--num-minibatches", "1"]))
        yield {s.name: s.address for s in services}
    finally:
        for service in services:
            service.stop()


def _broker(stack: dict, run_dir: Path, simulators: list[str]):
    return start_service(
        "broker",
        [
            "broker",
            "--simulators",
            ",".join(simulators),
            "--learner",
            stack["learner"],
            "--mode",
            "fast",
            "--alpha",
            "0.5",
            "--samples-per-iteration",
            "64",
            "--iterations",
            "0",
            "--run-dir",
            str(run_dir),
            "--port",
            "0",
        ],
    )


@pytest.mark.slow
def test_status_history_and_watch_until_the_run_stops(stack, tmp_path) -> None:
    broker = _broker(stack, tmp_path, [stack["sim-a"], stack["sim-b"]])
    try:
        with open_blocking_channel(broker.address) as channel:
            stub = pb_grpc.BrokerStub(channel)
            status = lambda: stub.GetRunStatus(pb.GetRunStatusRequest(), timeout=5)  # noqa: E731
            _wait(lambda: status().iteration >= 3, 120, "three iterations")

            reply = status()
            lines = _lines(tmp_path)
            done = [lines[i] for i in range(1, reply.iteration + 1)]
            assert _same(metrics_from_proto(reply.last_metrics), done[-1])
            assert done[-1]["settings"] == {
                "alpha": 0.5,
                "t_max": 200,
                "samples_per_iteration": 64,
                "alpha_auto": False,
                "mode": "fast",
                "mode_auto": False,
            }
            assert reply.settings == pb.RunSettings(alpha=0.5, t_max=200, samples_per_iteration=64, mode="fast")
            assert not reply.HasField("pending_settings") and reply.num_slots == 5
            assert reply.transitions_total == sum(m["transitions"] for m in done)
            assert reply.valid_steps_total == sum(m["valid_transitions"] for m in done)
            assert reply.global_resets_total == sum(m["global_resets"] for m in done)
            assert reply.faults_total == 0 and reply.stale_batches == 0
            lengths = [n for m in done for n in m["episode_lengths"]]
            returns = [r for m in done for r in m["episode_returns"]]
            histogram = reply.episode_length_histogram
            assert len(histogram.cumulative_counts) == len(histogram.upper_bounds) + 1 == 12
            assert histogram.cumulative_counts[-1] == len(lengths) > 0 and histogram.sum == sum(lengths)
            assert histogram.cumulative_counts[0] == sum(n <= 1 for n in lengths)
            assert reply.episode_return_histogram.cumulative_counts[-1] == len(returns)
            assert reply.episode_return_histogram.sum == pytest.approx(sum(returns))
            for sim in reply.simulators:
                assert sim.env_id == "takeover" and not sim.draining
                assert sim.step_latency_s > 0 and sim.reset_latency_s > 0

            history = stub.GetMetricsHistory(pb.GetMetricsHistoryRequest(since_iteration=1, max_count=2), timeout=5)
            assert [m.iteration for m in history.iterations] == [2, 3]
            everything = stub.GetMetricsHistory(pb.GetMetricsHistoryRequest(), timeout=5).iterations
            assert [m.iteration for m in everything][:3] == [1, 2, 3]
            assert _same(metrics_from_proto(everything[0]), lines[1])
            with pytest.raises(grpc.RpcError) as bad:
                stub.GetMetricsHistory(pb.GetMetricsHistoryRequest(max_count=-5), timeout=5)
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "max_count is -5" in bad.value.details()

            since = status().iteration
            watched: list[int] = []
            stream = stub.WatchMetrics(pb.WatchMetricsRequest(since_iteration=since - 1), timeout=120)
            watcher = threading.Thread(target=lambda: watched.extend(m.iteration for m in stream), daemon=True)
            watcher.start()
            _wait(lambda: len(watched) >= 3, 120, "two new iterations on the watch stream")
            stub.Control(pb.ControlRequest(action=pb.CONTROL_ACTION_STOP), timeout=5)
            watcher.join(timeout=60)
            assert not watcher.is_alive()  # the stream ended with the run
            assert watched == list(range(since, since + len(watched)))
        assert broker.process.wait(timeout=60) == 0
        assert watched[-1] == max(_lines(tmp_path))
    finally:
        broker.stop()


@pytest.mark.slow
def test_update_settings_turns_alpha_auto_and_mode_auto_on_and_off(stack, tmp_path) -> None:
    broker = _broker(stack, tmp_path, [stack["sim-a"], stack["sim-b"]])
    try:
        with open_blocking_channel(broker.address) as channel:
            stub = pb_grpc.BrokerStub(channel)
            _wait(lambda: 1 in _lines(tmp_path), 120, "a first iteration")  # measured before auto is on
            on = stub.UpdateSettings(pb.UpdateSettingsRequest(alpha_auto=True), timeout=5)
            assert on.settings.alpha_auto and on.settings.alpha == 0.5
            auto_from = on.effective_iteration
            _wait(lambda: auto_from + 1 in _lines(tmp_path), 120, f"iteration {auto_from + 1}")
            lines = _lines(tmp_path)
            assert {"name": "alpha_auto", "old_value": False, "new_value": True} in lines[auto_from]["settings_changed"]
            for i in (auto_from, auto_from + 1):  # chosen from the run so far, as it went
                assert lines[i]["settings"]["alpha_auto"] and lines[i]["alpha_auto"]["source"] == "model"
                assert lines[i]["alpha_auto"]["alpha"] == lines[i]["settings"]["alpha"]
            assert all("alpha_auto" not in lines[i] for i in range(1, auto_from))
            off = stub.UpdateSettings(pb.UpdateSettingsRequest(alpha=0.7), timeout=5)
            assert not off.settings.alpha_auto and off.settings.alpha == 0.7
            _wait(lambda: off.effective_iteration in _lines(tmp_path), 120, f"iteration {off.effective_iteration}")
            line = _lines(tmp_path)[off.effective_iteration]
            assert line["settings"]["alpha"] == 0.7 and not line["settings"]["alpha_auto"] and "alpha_auto" not in line
            assert {"name": "alpha_auto", "old_value": True, "new_value": False} in line["settings_changed"]

            # The mode, fixed by name, then chosen (mode auto) from the mode in force.
            ver = stub.UpdateSettings(pb.UpdateSettingsRequest(mode="ver"), timeout=5)
            assert ver.settings.mode == "ver" and not ver.settings.mode_auto
            _wait(lambda: ver.effective_iteration in _lines(tmp_path), 120, f"iteration {ver.effective_iteration}")
            line = _lines(tmp_path)[ver.effective_iteration]
            assert line["mode"] == line["settings"]["mode"] == "ver" and "mode_auto" not in line
            assert {"name": "mode", "old_value": "fast", "new_value": "ver"} in line["settings_changed"]
            assert line["policy_version"] == _lines(tmp_path)[ver.effective_iteration - 1]["policy_version"] + 1
            assert stub.GetRunStatus(pb.GetRunStatusRequest(), timeout=5).mode == "ver"
            auto = stub.UpdateSettings(pb.UpdateSettingsRequest(mode="auto"), timeout=5)
            assert auto.settings.mode == "ver" and auto.settings.mode_auto
            _wait(lambda: auto.effective_iteration in _lines(tmp_path), 120, f"iteration {auto.effective_iteration}")
            line = _lines(tmp_path)[auto.effective_iteration]
            assert line["settings"]["mode_auto"] and line["mode_auto"]["mode"] == line["mode"] == "ver"
            assert line["mode_auto"]["source"] == "start" and line["mode_auto"]["iterations"]["ver"] >= 1
            assert {"name": "mode_auto", "old_value": False, "new_value": True} in line["settings_changed"]
            stub.Control(pb.ControlRequest(action=pb.CONTROL_ACTION_STOP), timeout=5)
        assert broker.process.wait(timeout=60) == 0
    finally:
        broker.stop()


@pytest.mark.slow
def test_update_settings_and_detach_then_register_again(stack, tmp_path) -> None:
    a, b = stack["sim-a"], stack["sim-b"]  # 2 and 3 slots
    broker = _broker(stack, tmp_path, [a, b])
    try:
        with open_blocking_channel(broker.address) as channel:
            stub = pb_grpc.BrokerStub(channel)
            status = lambda: stub.GetRunStatus(pb.GetRunStatusRequest(), timeout=5)  # noqa: E731
            _wait(lambda: status().iteration >= 1, 120, "a first iteration")

            for request, fragment in [
                (pb.UpdateSettingsRequest(), "no setting given"),
                (pb.UpdateSettingsRequest(alpha=0.0), "alpha is 0.0; allowed: 0 < alpha <= 1"),
                (pb.UpdateSettingsRequest(alpha=1.01), "alpha is 1.01"),
                (pb.UpdateSettingsRequest(t_max=0), "t_max is 0; allowed: an integer in 1..100,000"),
                (pb.UpdateSettingsRequest(t_max=100_001), "t_max is 100001"),
                (pb.UpdateSettingsRequest(samples_per_iteration=0), "samples_per_iteration is 0"),
                (pb.UpdateSettingsRequest(samples_per_iteration=10_000_001), "samples_per_iteration is 10000001"),
                (
                    pb.UpdateSettingsRequest(mode="turbo"),
                    "mode is 'turbo'; allowed: sc, autoreset, sgr, ver, fast or auto",
                ),
            ]:
                with pytest.raises(grpc.RpcError) as refused:
                    stub.UpdateSettings(request, timeout=5)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, request
                assert fragment in refused.value.details()

            changed = stub.UpdateSettings(pb.UpdateSettingsRequest(alpha=1.0, samples_per_iteration=100), timeout=5)
            new = pb.RunSettings(alpha=1.0, t_max=200, samples_per_iteration=100, mode="fast")
            assert changed.settings == new
            effective = changed.effective_iteration
            _wait(lambda: effective in _lines(tmp_path), 120, f"iteration {effective}")
            lines = _lines(tmp_path)
            assert lines[effective]["settings"] == {
                "alpha": 1.0,
                "t_max": 200,
                "samples_per_iteration": 100,
                "alpha_auto": False,
                "mode": "fast",
                "mode_auto": False,
            }
            assert lines[effective]["valid_transitions"] >= 100
            broker_changes = [
                c for c in lines[effective]["settings_changed"] if c["name"] not in ("learning_rate", "ent_coef")
            ]
            assert broker_changes == [
                {"name": "alpha", "old_value": 0.5, "new_value": 1.0},
                {"name": "samples_per_iteration", "old_value": 64, "new_value": 100},
            ]
            assert all(lines[i]["settings"]["samples_per_iteration"] == 64 for i in range(1, effective))
            assert status().settings == new and not status().HasField("pending_settings")

            with pytest.raises(grpc.RpcError) as unknown:
                stub.DetachSimulator(pb.DetachSimulatorRequest(address="127.0.0.1:1"), timeout=5)
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
            assert "'127.0.0.1:1' is not attached" in unknown.value.details()

            assert stub.DetachSimulator(pb.DetachSimulatorRequest(address=a), timeout=5).num_slots == 2
            detached_at = status().iteration
            with pytest.raises(grpc.RpcError) as last:  # a drains: b is the last one left
                stub.DetachSimulator(pb.DetachSimulatorRequest(address=b), timeout=5)
            assert last.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            _wait(lambda: [s.address for s in status().simulators] == [b], 120, "simulator a to leave")
            assert status().num_slots == 3
            later = _wait(lambda: [m for i, m in _lines(tmp_path).items() if i > detached_at + 1], 120, "an iteration")
            assert all(m["num_slots"] == 3 for m in later)  # a's slots no longer sample

            assert stub.RegisterSimulator(pb.RegisterSimulatorRequest(address=a), timeout=10).num_slots == 2
            _wait(lambda: status().num_slots == 5, 120, "simulator a to join again")
            assert {s.address: s.draining for s in status().simulators} == {b: False, a: False}
            rejoined_at = status().iteration
            _wait(lambda: any(m["num_slots"] == 5 for i, m in _lines(tmp_path).items() if i > rejoined_at), 120, "5")
            stub.Control(pb.ControlRequest(action=pb.CONTROL_ACTION_STOP), timeout=5)
        assert broker.process.wait(timeout=60) == 0
    finally:
        broker.stop()

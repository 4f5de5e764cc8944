"""The hot-path profile's sorting of py-spy stacks into kinds of work (benchmarks/tools/hot_path.py),
and py-spy attached to a real process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from benchmarks.tools import hot_path

LOOP = "BaseEventLoop._run_once (asyncio/base_events.py:1922);Handle._run (asyncio/events.py:80)"


def stack(*frames: str, thread: str = "thread (7): MainThread") -> str:
    return ";".join((thread, *frames))


@pytest.mark.parametrize(
    "frames, kind",
    [
        ((LOOP, "EpollSelector.select (selectors.py:468)"), "waiting"),
        (
            (
                LOOP,
                "LockstepSampler.sample (broker/samplers/lockstep.py:238)",
                "PolicyRunner.act (broker/policy_runner.py:108)",
                "PolicyRunner._forward (broker/policy_runner.py:95)",
            ),
            "inference",
        ),  # fmt: skip
        (
            (
                LOOP,
                "StepStream.step (sim_server/client.py:171)",
                "step_reply (sim_server/client.py:78)",
                "from_proto (fast/tensor.py:91)",
            ),
            "serialisation",
        ),  # fmt: skip
        (
            (
                LOOP,
                "StepStream.step (sim_server/client.py:171)",
                "step_reply (sim_server/client.py:77)",
                "_transform (grpc/_common.py:87)",
            ),
            "transport",
        ),  # fmt: skip: grpc's own frame is innermost
        ((LOOP, "StepStream.step (sim_server/client.py:159)"), "serialisation"),  # building the request
        (
            (LOOP, "StepStream.step (sim_server/client.py:168)", "_StreamResponseMixin.read (grpc/aio/_call.py:400)"),
            "transport",
        ),  # fmt: skip
        ((LOOP, "SimulatorPool._call (broker/pool.py:509)", "wait_for (asyncio/tasks.py:467)"), "event loop"),
        ((LOOP, "LockstepSampler.sample (broker/samplers/lockstep.py:246)"), "bookkeeping"),
        ((LOOP,), "event loop"),
        (
            (
                LOOP,
                "SimulatorServicer._step (sim_server/servicer.py:142)",
                "Simulator.step (sim_server/simulator.py:187)",
                "TakeoverEnv.step (sim_server/takeover/env.py:113)",
            ),
            "simulator",
        ),  # fmt: skip
        ((LOOP, "SimulatorServicer._step (sim_server/servicer.py:144)"), "serialisation"),  # building the response
        (
            (
                LOOP,
                "Simulator.step (sim_server/simulator.py:191)",
                "CostModel.step (sim_server/cost_model.py:203)",
                "precise_wait (sim_server/precise_wait.py:47)",
            ),
            "waiting",
        ),  # fmt: skip: the emulated latency
        (("<module> (t.py:1)",), "other"),
    ],
)
def test_each_stack_gets_the_kind_of_its_innermost_claimed_frame(frames, kind):
    assert hot_path.classify(list(frames)) == kind


def test_busy_time_is_samples_over_rate_for_the_main_thread_only_and_waiting_is_the_rest():
    raw = "\n".join(
        [
            stack(LOOP, "PolicyRunner.act (broker/policy_runner.py:108)") + " 50",
            stack(LOOP, "from_proto (fast/tensor.py:91)") + " 25",
            stack(LOOP, "EpollSelector.select (selectors.py:468)") + " 900",  # idle, also outside the window
            stack(LOOP, "settle (benchmarks/tools/hot_path.py:135)") + " 75",  # the profiler's own pause: skipped
            stack("Thread.run (threading.py:982)", "poll (grpc/aio/_poller.py:1)", thread="thread (8): poller")
            + " 400",
            "not a stack line",
        ]
    )
    busy = hot_path.busy_seconds(raw, rate_hz=250)
    assert busy["inference"] == pytest.approx(0.2)
    assert busy["serialisation"] == pytest.approx(0.1)
    assert busy["transport"] == 0.0 and "waiting" not in busy
    ms = hot_path.per_step_ms(raw, rate_hz=250, window_s=1.0, steps=100)
    assert ms["inference"] == pytest.approx(2.0) and ms["serialisation"] == pytest.approx(1.0)
    assert ms["waiting"] == pytest.approx(7.0)  # 1 s window less 0.3 s busy, over 100 steps
    assert sum(ms.values()) == pytest.approx(10.0)


def test_waiting_is_never_negative_when_the_samples_overrun_the_window():
    raw = stack(LOOP, "PolicyRunner.act (broker/policy_runner.py:108)") + " 500"
    ms = hot_path.per_step_ms(raw, rate_hz=250, window_s=1.0, steps=10)
    assert ms["waiting"] == 0.0 and ms["inference"] == pytest.approx(200.0)


@pytest.mark.skipif(not hot_path.can_attach(), reason="py-spy missing or not allowed to attach here")
def test_py_spy_attached_to_a_running_process_sees_where_it_spends_its_time(tmp_path):
    # A child that spends its time in policy inference's file name and in an idle selector, half each.
    # Run as the module broker.policy_runner from tmp_path, so py-spy names its file as it names the broker's.
    script = tmp_path / "broker" / "policy_runner.py"
    script.parent.mkdir()
    (script.parent / "__init__.py").write_text("")
    script.write_text(
        textwrap.dedent(
            """
            import selectors, socket, threading, time
            def act(seconds):
                end = time.perf_counter() + seconds
                while time.perf_counter() < end:
                    pass
            sel = selectors.DefaultSelector()
            a, b = socket.socketpair()
            sel.register(a, selectors.EVENT_READ)
            print("ready", flush=True)
            while True:
                act(0.02)
                sel.select(0.02)
            """
        )
    )
    child = subprocess.Popen(
        [sys.executable, "-m", "broker.policy_runner"], cwd=tmp_path, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        sampler = hot_path.Sampler(child.pid, tmp_path / "raw.txt", rate_hz=200)
        time.sleep(1.5)
        raw = sampler.stop()
        if not raw and "ermission" in sampler.error:
            pytest.skip(f"py-spy may not attach here: {sampler.error}")
        assert raw, sampler.error
        busy = hot_path.busy_seconds(raw, rate_hz=200)
        # About half of ~1.5 s spinning in act (attach time makes it less); never more than the wall time.
        assert 0.3 < busy["inference"] < 1.5
        assert busy["serialisation"] == busy["transport"] == 0.0
    finally:
        child.kill()
        child.wait()

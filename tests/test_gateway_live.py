"""The gateway against the real running stack: uvicorn, broker, learner and simulator processes.

One run, steered as a user steers it over REST: change alpha and the learning rate live and see the
next iterations use them; pause and resume with no lost or repeated iteration; download the policy
while paused and run it with torch.jit and onnxruntime; attach a second simulator server and see its
slots used, then detach it; stop.
"""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
import torch
from live_stack import SIM_ARGS, live_stack

from jobs.processes import start_service
from learner.client import LearnerClient

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with live_stack(tmp_path_factory.mktemp("gateway-live")) as running:
        extra = start_service("sim-extra", [*SIM_ARGS, "--port", "0", "--seed", "7"], timeout_s=90)
        running.extra_sim = extra
        try:
            yield running
        finally:
            extra.stop()


def _iterations(stack) -> list[int]:
    return [line["iteration"] for line in stack.metrics_lines()]


def test_live_1_status_reads(stack):
    status = stack.wait_for(lambda s: s["iteration"] >= 2, what="two iterations")
    assert status["state"] == "running" and status["mode"] == "fast"
    assert status["num_slots"] == 3 and status["simulators"][0]["up"]
    assert status["last_metrics"]["valid_transitions"] >= 96
    assert status["simulators"][0]["step_latency_s"] > 0
    code, history = stack.call("GET", "/v1/metrics/history?since=0", token=None)
    assert code == 200 and [m["iteration"] for m in history][:2] == [1, 2]
    code, ready = stack.call("GET", "/readyz", token=None)
    assert code == 200 and ready["ready"]


def test_live_2_change_alpha_and_lr(stack):
    code, body = stack.call("PATCH", "/v1/config", {"alpha": 0.25, "samples_per_iteration": 150, "learning_rate": 1e-4})
    assert code == 200, body
    effective = body["broker"]["effective_iteration"]
    assert body["broker"]["settings"]["alpha"] == 0.25
    stack.wait_for(lambda s: s["iteration"] >= effective + 1, what="the change to take effect")
    lines = {line["iteration"]: line for line in stack.metrics_lines()}
    before, after = lines[effective - 1], lines[effective]
    assert before["settings"]["alpha"] == 0.5 and after["settings"]["alpha"] == 0.25
    assert after["valid_transitions"] >= 150
    changed = {c["name"]: c for c in after["settings_changed"]}
    assert changed["alpha"]["old_value"] == 0.5 and changed["alpha"]["new_value"] == 0.25
    assert "samples_per_iteration" in changed
    # The learner's change shows in the stats of the first update that used it.
    later = stack.wait_for(
        lambda s: s["last_metrics"]["learner"]["learning_rate"] == pytest.approx(1e-4), what="the new learning rate"
    )
    assert later["learner"]["hyperparameters"]["learning_rate"] == pytest.approx(1e-4)
    assert any(c["name"] == "learning_rate" for line in stack.metrics_lines() for c in line.get("settings_changed", []))


# The download's TorchScript format is what the API promises (learner/export.py); torch 2.13 deprecates
# loading it, as tests/test_policy_export.py notes.
@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_live_3_pause_download_resume(stack):
    code, body = stack.call("POST", "/v1/run/pause")
    assert code == 200, body
    paused = stack.wait_for(lambda s: s["state"] == "paused", what="paused")
    asyncio.run(asyncio.sleep(1.5))
    assert stack.status()["iteration"] == paused["iteration"]  # nothing sampled while paused

    # While paused the policy version holds still: download it and compare with the learner's own.
    code, torchscript = stack.call("GET", "/v1/policy?format=torchscript", token=None)
    assert code == 200
    code, onnx_model = stack.call("GET", "/v1/policy?format=onnx", token=None)
    assert code == 200
    policy = asyncio.run(_learner_policy(stack.learner.address))
    network = policy.actor_critic()
    obs = np.random.default_rng(0).normal(size=(16, *policy.observation_space.shape)).astype(np.float32)
    with torch.no_grad():
        mean = network.actor_mean(torch.from_numpy(obs)).numpy()
    low, high = np.asarray(policy.action_space.low), np.asarray(policy.action_space.high)
    expected = np.clip(mean, low, high)
    scripted = torch.jit.load(io.BytesIO(torchscript["raw"]))
    np.testing.assert_allclose(scripted(torch.from_numpy(obs)).numpy(), expected, atol=1e-5)
    import onnxruntime

    session = onnxruntime.InferenceSession(onnx_model["raw"], providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(["action"], {"obs": obs})[0], expected, atol=1e-5)

    code, body = stack.call("POST", "/v1/run/resume")
    assert code == 200 and body["state"] == "running"
    stack.wait_for(lambda s: s["iteration"] >= paused["iteration"] + 2, what="sampling again")
    iterations = _iterations(stack)
    assert iterations == list(range(1, len(iterations) + 1))  # none lost, none repeated


async def _learner_policy(address: str):
    async with LearnerClient(address) as learner:
        return await learner.get_policy()


def test_live_4_attach_then_detach(stack):
    extra = stack.extra_sim.address
    code, body = stack.call("POST", "/v1/simulators", {"address": extra})
    assert code == 201, body
    assert body["num_slots"] == 3
    status = stack.wait_for(lambda s: s["num_slots"] == 6, what="the new slots")
    start = status["iteration"]
    status = stack.wait_for(
        lambda s: s["iteration"] >= start + 2 and s["last_metrics"]["num_slots"] == 6, what="iterations on 6 slots"
    )
    (joined,) = [s for s in status["simulators"] if s["address"] == extra]
    assert joined["up"] and joined["step_latency_s"] > 0  # its slots were stepped

    code, body = stack.call("DELETE", f"/v1/simulators/{extra}")
    assert code == 202, body
    status = stack.wait_for(lambda s: all(sim["address"] != extra for sim in s["simulators"]), what="detached")
    start = status["iteration"]
    status = stack.wait_for(lambda s: s["iteration"] >= start + 1, what="an iteration after the detach")
    assert status["num_slots"] == 3 and status["last_metrics"]["num_slots"] == 3
    iterations = _iterations(stack)
    assert iterations == list(range(1, len(iterations) + 1))
    # A wrong address is refused and the run goes on.
    code, body = stack.call("POST", "/v1/simulators", {"address": "127.0.0.1:1"})
    assert code == 422 and "did not answer" in body["detail"]
    assert stack.status()["state"] == "running"


def test_live_5_mutations_need_the_token(stack):
    assert stack.call("POST", "/v1/run/pause", token=None)[0] == 401
    assert stack.call("POST", "/v1/run/pause", token="wrong-token")[0] == 403
    assert stack.status()["state"] == "running"


def test_live_6_prometheus(stack):
    code, body = stack.call("GET", "/metrics", token=None)
    text = body["raw"].decode()
    assert code == 200
    assert 'fast_upstream_up{service="broker"} 1.0' in text
    assert "fast_episode_length_bucket" in text and "fast_effective_throughput" in text


def test_live_7_stop(stack):
    code, body = stack.call("POST", "/v1/run/stop")
    assert code == 200, body
    assert stack.broker.process.wait(timeout=60) == 0  # it finished its iteration and exited cleanly
    iterations = _iterations(stack)
    assert iterations == list(range(1, len(iterations) + 1))
    code, body = stack.call("GET", "/v1/status", token=None)
    assert code == 503 and body["upstream"] == "broker"

"""The simulator kit: fussy engines (main-thread only, one per process) served by `fast sim-server`.

`--processes N` spreads the slots over worker processes that step their engines in their main
threads (sim_server/workers.py); without it the server steps them in its own main thread. Both
give the in-process reference's trajectories; a dead worker fails its slots' calls naming it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import kit_envs
import numpy as np
import pytest

from jobs.processes import Launch, ServiceProcess, StartupError, start_service, stop, wait_listening
from sim_server.client import SimulatorClient
from sim_server.environments import check_env_spec, gym_factory, make_env
from sim_server.errors import ErrorKind, SimError
from sim_server.gym_adapter import GymSlotEnv
from sim_server.kit import env_spec

TESTS = str(Path(__file__).resolve().parent)
PYTHONPATH = {"PYTHONPATH": os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH", "")) if p)}
MAIN_THREAD = f"gym:kit_envs:{kit_envs.MAIN_THREAD_ID}"
SINGLETON = f"gym:kit_envs:{kit_envs.SINGLETON_ID}"
SLOTS = np.arange(4)
CLIPS = np.array([3, 5, 3, 7])  # slots 0 and 2 (on different workers) play the same clip and seed
SEEDS = np.array([1, 2, 1, 0])
STEPS = 45  # past the time limit (40): every slot's episode ends
# The kit server's catalog: CLIPS fit in it, and it is below the 10 clips an evaluation needs, so the training
# run on it also shows a run on too few clips skipping its evaluation with a note.
KIT_CLIPS = 8


def _actions(step: int) -> np.ndarray:
    return np.random.default_rng(step).integers(0, 3, size=SLOTS.size)


def _env_server(*args: str) -> ServiceProcess:
    """A `fast sim-server` as conftest's sim_server() starts one, with tests/ importable (workers import kit_envs)."""
    return start_service("sim-server", ["sim-server", "--host", "127.0.0.1", "--port", "0", *args], env=PYTHONPATH)


@contextmanager
def _served_env(*args: str) -> Iterator[ServiceProcess]:
    server = _env_server(*args)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def kit_server() -> Iterator[ServiceProcess]:
    server = _env_server("--env", MAIN_THREAD, "--processes", "2", "--slots", "4", "--num-clips", str(KIT_CLIPS))
    try:
        yield server
    finally:
        server.stop()


def _reference() -> list[tuple]:
    """The trajectory of the scripted calls on the env in this process (the main thread)."""
    env = GymSlotEnv(gym_factory(MAIN_THREAD[4:]), num_slots=4, num_clips=KIT_CLIPS)
    trajectory: list[tuple] = [("reset", env.reset(SLOTS, CLIPS, SEEDS))]
    live = np.ones(SLOTS.size, dtype=bool)
    for step in range(STEPS):
        if not live.any():
            break
        slots = SLOTS[live]
        r = env.step(slots, _actions(step)[live])
        trajectory.append(("step", slots, r.observations, r.rewards, r.terminated, r.truncated))
        live[slots[r.terminated | r.truncated]] = False
    env.close()
    return trajectory


async def _served(address: str) -> list[tuple]:
    """The same calls through SimulatorClient."""
    async with SimulatorClient(address, timeout_s=30) as client:
        trajectory: list[tuple] = [("reset", (await client.reset(SLOTS, CLIPS, SEEDS)).observations)]
        live = np.ones(SLOTS.size, dtype=bool)
        for step in range(STEPS):
            if not live.any():
                break
            slots = SLOTS[live]
            r = await client.step(slots, _actions(step)[live])
            trajectory.append(("step", r.slot_ids, r.observations, r.rewards, r.terminated, r.truncated))
            live[slots[r.terminated | r.truncated]] = False
        return trajectory


def _assert_same(ours: list[tuple], reference: list[tuple]) -> None:
    assert len(ours) == len(reference)
    for a, b in zip(ours, reference):
        assert a[0] == b[0]
        for x, y in zip(a[1:], b[1:]):
            np.testing.assert_array_equal(x, y)


def _worker_pids(server: ServiceProcess) -> dict[int, int]:
    line = next(line for line in server.output if "fast sim-server workers:" in line)
    return {int(w): int(p) for w, p in re.findall(r"worker (\d+) \(pid (\d+)", line)}


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_gone(pids: list[int], patience_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + patience_s
    while any(map(_running, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _running(p)]


# -- the test engines are as fussy as they claim ------------------------------------------------------------


def test_kit_envs_refuse_other_threads_and_second_instances() -> None:
    errors: list[BaseException] = []

    def make() -> None:
        try:
            kit_envs.MainThreadEnv()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=make)
    thread.start()
    thread.join()
    assert errors and "main-thread only" in str(errors[0])
    first = kit_envs.SingletonEnv()
    try:
        with pytest.raises(RuntimeError, match="second engine instance"):
            kit_envs.SingletonEnv()
    finally:
        first.close()


def test_env_specs_factories_and_processes_bounds() -> None:
    assert check_env_spec("slot:kit_envs:make_slot_env") == "slot:kit_envs:make_slot_env"
    with pytest.raises(ValueError, match="slot:<module>:<factory>"):
        check_env_spec("slot:nomodule")
    env = make_env("slot:kit_envs:make_slot_env", 2, num_clips=7)
    assert env.num_slots == 2 and env.num_clips == 7
    factory_env = make_env("gym:kit_envs:make_main_thread_env", 2, env_kwargs={"push": 0.5})
    assert factory_env.reset(np.arange(2), np.array([3, 3]), np.array([1, 1])).shape == (2, 4)
    factory_env.close()
    with pytest.raises(ValueError, match="between 1 and the number of slots"):
        make_env(MAIN_THREAD, 2, processes=3)


# -- served with --processes ----------------------------------------------------------------------------------


def test_processes_give_the_in_process_trajectories(kit_server: ServiceProcess) -> None:
    pids = _worker_pids(kit_server)
    assert sorted(pids) == [0, 1] and kit_server.pid not in pids.values()
    reference = _reference()
    served = asyncio.run(_served(kit_server.address))
    _assert_same(served, reference)
    np.testing.assert_array_equal(served[0][1][0], served[0][1][2])  # same clip and seed on two workers


def test_without_processes_the_server_steps_main_thread_engines_in_its_main_thread() -> None:
    server = _env_server("--env", MAIN_THREAD, "--slots", "4", "--num-clips", "20")
    try:
        _assert_same(asyncio.run(_served(server.address)), _reference())
    finally:
        assert server.stop() == 0


@pytest.mark.slow
def test_sim_check_passes_on_a_processes_server_drain_included(tmp_path: Path) -> None:
    with _served_env("--env", MAIN_THREAD, "--processes", "2", "--slots", "4", "--num-clips", "20") as server:
        pids = list(_worker_pids(server).values())
        done = subprocess.run(
            [sys.executable, "-m", "fast", "sim-check", server.address, "--pid", str(server.pid)]
            + ["--json", str(tmp_path / "check.json")],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads((tmp_path / "check.json").read_text())
        assert {r["status"] for r in report["results"]} <= {"pass", "skip"}, done.stdout
        drain = [r for r in report["results"] if r["check"] == "drain"]
        assert drain and all(r["status"] == "pass" for r in drain), done.stdout  # SIGTERM drained it
    assert _wait_gone(pids) == []  # and its workers were joined


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_train_runs_on_a_processes_server(kit_server: ServiceProcess, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fast",
            "train",
            "--runs-dir",
            str(tmp_path),
            "--name",
            "kit",
            "--simulators",
            kit_server.address,
            "--iterations",
            "2",
            "--samples-per-iteration",
            "64",
            "--update-epochs",
            "1",
            "--eval-episodes-per-clip",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        timeout=360,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert kit_server.alive()
    # 8 clips: too few to hold 10% out, so the evaluation is skipped, and the run says so.
    assert "needs at least 10" in done.stdout and "evaluation skipped" in done.stdout
    evaluation = json.loads((tmp_path / "kit" / "eval.json").read_text())
    assert f"{KIT_CLIPS} clip(s)" in evaluation["skipped"]
    report = (tmp_path / "kit" / "report.md").read_text()
    assert f"| evaluation | skipped: the simulators have {KIT_CLIPS} clip(s)" in report


# -- one engine per process ------------------------------------------------------------------------------------


def test_singleton_engines_need_a_process_each() -> None:
    with pytest.raises(StartupError, match="second engine instance"):
        with _served_env("--env", SINGLETON, "--slots", "2"):
            pass
    with _served_env("--env", SINGLETON, "--slots", "3", "--processes", "3") as server:

        async def play() -> None:
            async with SimulatorClient(server.address, timeout_s=30) as client:
                assert (await client.describe()).num_slots == 3
                await client.reset([0, 1, 2], [1, 2, 3], [0, 0, 0])
                r = await client.step([2, 0, 1], np.array([0, 1, 2]))
                assert list(r.slot_ids) == [2, 0, 1] and r.observations.shape == (3, 4)

        asyncio.run(play())


# -- faults and lifetime ------------------------------------------------------------------------------------------


def test_a_killed_worker_fails_its_slots_naming_it_and_the_rest_keeps_serving() -> None:
    server = _env_server("--env", MAIN_THREAD, "--processes", "2", "--slots", "2")
    try:
        pids = _worker_pids(server)

        async def play() -> None:
            async with SimulatorClient(server.address, timeout_s=30) as client:
                await client.reset([0, 1], [1, 2], [0, 0])
                os.kill(pids[1], signal.SIGKILL)
                for _ in range(2):  # the first call finds it dead, the next knows it
                    with pytest.raises(grpc.aio.AioRpcError) as excinfo:
                        await client.step([0, 1], np.array([1, 1]))
                    assert excinfo.value.code() == grpc.StatusCode.UNAVAILABLE
                    details = excinfo.value.details()
                    assert f"worker 1 (pid {pids[1]}, slot 1) is gone" in details and "SIGKILL" in details
                assert (await client.describe()).num_slots == 2
                await client.reset([0], [3], [0])  # worker 0's slot still plays
                r = await client.step([0], np.array([2]))
                assert r.observations.shape == (1, 4)

        asyncio.run(play())
        assert server.alive()
    finally:
        assert server.stop() == 0  # SIGTERM: drained, workers joined, exit 0
    assert _wait_gone([pids[0]]) == []


def test_workers_die_with_a_killed_server() -> None:
    server = _env_server("--env", MAIN_THREAD, "--processes", "2", "--slots", "2")
    pids = list(_worker_pids(server).values())
    assert all(map(_running, pids))
    server.kill()  # SIGKILL: the server stops nobody; the workers see their pipes close
    assert _wait_gone(pids) == []


# -- the Python entry point ------------------------------------------------------------------------------------

KIT_SCRIPT = """
import gymnasium as gym
import kit_envs
from sim_server import kit


def make_engine(push=0.3):
    return gym.wrappers.TimeLimit(kit_envs.MainThreadEnv(push), max_episode_steps=40)


if __name__ == "__main__":
    kit.run(make_engine, slots=2, processes=2, port=0, num_clips=20)
"""


def test_kit_run_serves_a_script_factory_in_workers(tmp_path: Path) -> None:
    script = tmp_path / "my_sim.py"
    script.write_text(KIT_SCRIPT)
    child = launch_script(script)
    try:
        server = wait_listening(child, time.monotonic() + 60)
        assert "env=gym:__main__:make_engine" in " ".join(server.output)
        assert len(_worker_pids(server)) == 2

        async def play() -> None:
            async with SimulatorClient(server.address, timeout_s=30) as client:
                first = await client.reset([0, 1], [3, 3], [1, 1])
                np.testing.assert_array_equal(first.observations[0], first.observations[1])
                assert (await client.step([0, 1], np.array([0, 2]))).observations.shape == (2, 4)

        asyncio.run(play())
        assert server.stop() == 0
    finally:
        stop(child, timeout_s=10)
    with pytest.raises(ValueError, match="define the factory at module level"):
        env_spec(lambda: None)
    assert env_spec("CartPole-v1") == "gym:CartPole-v1" and env_spec(kit_envs.make_slot_env, "slot").startswith("slot:")


def launch_script(script: Path) -> Launch:
    """`python SCRIPT` with its output drained, as jobs.processes.launch does for `python -m fast`."""
    process = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **PYTHONPATH},
    )
    child = Launch("my-sim", [sys.executable, str(script)], PYTHONPATH, process)

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            child.lines.append(line.rstrip("\n"))
            match = re.search(r"listening on (\S+)", line)
            if match and not child.found:
                child.found.append(match.group(1))
                child.ready.set()
        child.ready.set()

    threading.Thread(target=pump, daemon=True).start()
    return child


def test_an_engine_that_raises_fails_the_call_internal_and_its_worker_lives_on() -> None:
    env = make_env(MAIN_THREAD, 2, processes=2, env_kwargs={"push": "not a number"})  # step computes 0 * "..."
    try:
        env.reset(np.arange(2), np.array([1, 2]), np.array([0, 0]))
        with pytest.raises(SimError) as excinfo:
            env.step(np.arange(2), np.array([1, 1]))
        assert excinfo.value.kind == ErrorKind.INTERNAL
        assert re.search(r"worker 0 \(pid \d+, slot 0\): env.step raised TypeError", excinfo.value.message)
        assert env.reset(np.arange(2), np.array([1, 2]), np.array([0, 0])).shape == (2, 4)  # both still answer
    finally:
        env.close()

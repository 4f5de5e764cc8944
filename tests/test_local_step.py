"""The local step socket (sim_server/local_step.py) on real `fast sim-server` processes.

A server advertises a Unix socket in Describe that serves the StepStream exchange without gRPC.
These tests check what a broker relies on: it answers exactly as StepStream does, it refuses a
caller without the run token before touching a slot, it ends with the status a StepStream would
end with, it lives in a private directory removed at shutdown, the broker's pool uses it for the
lock-step modes and for VER's concurrent calls, falls back to gRPC where it cannot open it, and
FAST samples the same batches over it as over gRPC.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import sim_server
from test_prefetch_system import sample_three

from broker.pool import SimulatorPool
from fast import frames
from fast.rpc import Credentials
from sim_server.client import LocalStepStream, SimulatorClient
from sim_server.local_step import DIRECTORY_PREFIX, OWNER_FILE, _owner_line, sweep_stale_directories


def _actions(k: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, size=(k, 2)).astype(np.float32)


async def _describe(address: str):
    async with SimulatorClient(address) as client:
        return await client.describe()


@pytest.fixture(scope="module")
def server():
    with sim_server("--slots", "6") as service:
        yield service


def test_describe_names_a_socket_in_a_private_directory_removed_at_shutdown() -> None:
    with sim_server("--slots", "2") as service:
        path = Path(asyncio.run(_describe(service.address)).local_step_socket)
        assert path.is_socket()
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not path.parent.exists()


def test_no_local_step_advertises_none() -> None:
    with sim_server("--slots", "2", "--no-local-step") as service:
        assert asyncio.run(_describe(service.address)).local_step_socket == ""


def test_local_stream_answers_as_the_step_stream_does(server) -> None:
    async def run():
        async with SimulatorClient(server.address) as client:
            desc = await client.describe()
            await client.reset([0, 1], [40, 40], [7, 7])
            local = await client.local_step_stream(desc.local_step_socket)
            remote = client.step_stream()
            actions = _actions(12, seed=3)
            pairs = [
                (await local.step([0], actions[t : t + 1]), await remote.step([1], actions[t : t + 1]))
                for t in range(12)
            ]
            await local.close()
            await remote.close()
            return pairs

    pairs = asyncio.run(run())
    for over_socket, over_grpc in pairs:
        assert over_socket.request_id == over_socket.sent_request_id
        np.testing.assert_array_equal(over_socket.observations, over_grpc.observations)
        np.testing.assert_array_equal(over_socket.rewards, over_grpc.rewards)
        np.testing.assert_array_equal(over_socket.terminated, over_grpc.terminated)
        assert over_socket.timing.emulated_s == pytest.approx(over_grpc.timing.emulated_s, abs=0.05)


def test_a_caller_without_the_token_is_refused_and_no_slot_moves(server) -> None:
    async def run():
        async with SimulatorClient(server.address) as client:
            desc = await client.describe()
            await client.reset([2], [41], [1])
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await LocalStepStream.open(desc.local_step_socket, "not-the-token", max_message_bytes=1 << 20)
            # The slot is where the reset left it: its first step matches a fresh reset's first step.
            first = await client.step([2], np.zeros((1, 2), np.float32))
            await client.reset([2], [41], [1])
            again = await client.step([2], np.zeros((1, 2), np.float32))
            return refused.value, first, again

    refused, first, again = asyncio.run(run())
    assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "run token" in refused.details()
    np.testing.assert_array_equal(first.observations, again.observations)
    assert "without the run token was refused" in "\n".join(server.output)


def test_a_bad_request_ends_the_exchange_with_its_status(server) -> None:
    async def run():
        async with SimulatorClient(server.address) as client:
            desc = await client.describe()
            await client.reset([3], [42], [1])
            local = await client.local_step_stream(desc.local_step_socket)
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await local.step([3], np.zeros((1, 5), np.float32))
            with pytest.raises(grpc.aio.AioRpcError) as ended:  # ended, as a StepStream ends with its status
                await local.step([3], np.zeros((1, 2), np.float32))
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
            fresh = await client.local_step_stream(desc.local_step_socket)
            reply = await fresh.step([3], np.zeros((1, 2), np.float32))
            await fresh.close()
            return bad.value, reply

    bad, reply = asyncio.run(run())
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT and "expected shape [1, 2]" in bad.details()
    assert list(reply.slot_ids) == [3]


def test_a_frame_over_the_limit_is_refused_before_it_is_read(server) -> None:
    path = asyncio.run(_describe(server.address)).local_step_socket
    token = Credentials.from_env().token.encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.settimeout(10)
        raw.connect(path)
        raw.sendall(frames.encode(frames.HELLO, token))
        assert raw.recv(5) == frames.encode(frames.READY)
        raw.sendall(struct.pack("<IB", 1 << 30, frames.STEP))  # 1 GiB announced, nothing sent
        length, kind = frames.HEADER.unpack(raw.recv(5))
        payload = raw.recv(length)
    assert kind == frames.ERROR
    code, message = frames.decode_error(payload)
    assert code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "over the limit" in message


def test_the_pool_steps_over_the_socket_for_streams_and_concurrent_calls(server) -> None:
    async def run():
        pool = SimulatorPool()
        try:
            await pool.add(server.address)
            (handle,) = pool.servers
            slots = np.arange(4)
            await pool.reset(slots, np.array([10, 11, 12, 13]), np.zeros(4, np.int64), batched=True)
            lockstep = await pool.step(slots, _actions(4, seed=1))
            stream = handle.stream
            # VER's way: two calls at once on disjoint slots, each on a connection of its own.
            a, b = await asyncio.gather(
                pool.step(slots[:2], _actions(2, seed=2), unary=True),
                pool.step(slots[2:], _actions(2, seed=3), unary=True),
            )
            again = await pool.step(slots[:2], _actions(2, seed=4), unary=True)
            return pool.step_transport(handle), stream, len(handle.local_spare), (lockstep, a, b, again)
        finally:
            await pool.close()

    transport, stream, spare, steps = asyncio.run(run())
    assert transport == "local socket"
    assert isinstance(stream, LocalStepStream)
    assert spare == 2  # the two concurrent calls' connections, the third call reused one
    assert not any(step.failed.any() for step in steps)


def test_a_socket_that_does_not_open_from_here_falls_back_to_grpc(server) -> None:
    async def run():
        pool = SimulatorPool()
        try:
            await pool.add(server.address)
            (handle,) = pool.servers
            handle.local_step_socket = "/nonexistent-fast-dir/step.sock"  # as on another machine
            await pool.reset(np.arange(2), np.array([5, 6]), np.zeros(2, np.int64), batched=True)
            step = await pool.step(np.arange(2), _actions(2, seed=1))
            return step, handle, pool.step_transport(handle)
        finally:
            await pool.close()

    step, handle, transport = asyncio.run(run())
    assert not step.failed.any() and handle.up and handle.faults == 0
    assert transport == "grpc stream" and handle.local_step_socket == ""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_fast_samples_the_same_batches_over_the_socket_as_over_grpc() -> None:
    with ExitStack() as stack:
        addresses = [stack.enter_context(sim_server("--slots", "3")).address for _ in range(2)]
        over_grpc, grpc_stats, grpc_pool = asyncio.run(sample_three(addresses, prefetch=False, use_local_step=False))
        local, local_stats, local_pool = asyncio.run(sample_three(addresses, prefetch=False))

    assert [grpc_pool.step_transport(s) for s in grpc_pool.servers] == ["grpc stream"] * 2
    assert [local_pool.step_transport(s) for s in local_pool.servers] == ["local socket"] * 2
    for a, b in zip(over_grpc, local):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert [s.valid for s in grpc_stats] == [s.valid for s in local_stats]


@pytest.fixture
def short_dir():
    """A directory with a short path: a Unix socket's path has at most 107 bytes, which pytest's
    tmp_path plus the server's own directory and name can exceed."""
    directory = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_a_killed_server_ends_the_exchange_unavailable_and_the_next_server_removes_its_directory(short_dir) -> None:
    tmp_path = short_dir
    with sim_server("--slots", "2", "--local-step-dir", str(tmp_path)) as service:

        async def run():
            async with SimulatorClient(service.address) as client:
                desc = await client.describe()
                await client.reset([0], [3], [0])
                local = await client.local_step_stream(desc.local_step_socket)
                await local.step([0], np.zeros((1, 2), np.float32))
                service.kill()
                with pytest.raises(grpc.aio.AioRpcError) as ended:
                    await local.step([0], np.zeros((1, 2), np.float32))
                assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
                return desc.local_step_socket

        path = asyncio.run(run())
    # SIGKILL leaves the directory behind (nothing runs to remove it); a broker that tries it gets refused.
    assert Path(path).parent.exists()
    with pytest.raises(OSError):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.connect(path)
    # The next server that starts there removes it (its owner is gone), and keeps its own.
    with sim_server("--slots", "2", "--local-step-dir", str(tmp_path)) as service:
        own = Path(asyncio.run(_describe(service.address)).local_step_socket)
        assert not Path(path).parent.exists()
        assert own.is_socket()
    assert list(tmp_path.iterdir()) == []


def _socket_directory(parent: Path, name: str, owner: str | None) -> Path:
    directory = parent / f"{DIRECTORY_PREFIX}{name}"
    directory.mkdir(mode=0o700)
    if owner is not None:
        (directory / OWNER_FILE).write_text(owner)
    return directory


def test_the_sweep_removes_only_directories_whose_owner_is_gone(tmp_path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    namespace = _owner_line(0).split(" ", 1)[1].strip()
    dead = _socket_directory(tmp_path, "dead", f"{gone.pid} {namespace}\n")
    live = _socket_directory(tmp_path, "live", f"{os.getpid()} {namespace}\n")
    no_owner = _socket_directory(tmp_path, "starting", None)  # a server between mkdtemp and its owner file
    elsewhere = _socket_directory(tmp_path, "other-namespace", f"{gone.pid} pid:[1]\n")
    garbled = _socket_directory(tmp_path, "garbled", "not a pid\n")
    unrelated = tmp_path / "unrelated"
    unrelated.mkdir()
    (unrelated / OWNER_FILE).write_text(f"{gone.pid} {namespace}\n")
    assert sweep_stale_directories(tmp_path) == 1
    assert not dead.exists()
    for kept in (live, no_owner, elsewhere, garbled, unrelated):
        assert kept.exists(), kept.name
    assert sweep_stale_directories(tmp_path / "missing") == 0

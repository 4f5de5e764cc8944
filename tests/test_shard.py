"""A broker's shard of a DNS name's replicas (fast/addresses.py, Shard): every replica belongs to exactly
one broker, however the answer is ordered, re-read, grown or shrunk; and a broker started on a shard."""

from __future__ import annotations

import asyncio
import ipaddress
import random
import socket
import subprocess
import sys
import time

import pytest
from test_broker_pool import FakeClient, _description

import broker.pool
from broker.config import BrokerConfig
from broker.run import BrokerRun, RunFailed
from fast.addresses import Shard, resolve_shard
from jobs.processes import start_service


def _block(first: str, count: int, port: int = 50051) -> list[str]:
    """`count` consecutive IPv4 addresses from `first`, as a DNS answer resolves to them."""
    start = ipaddress.ip_address(first)
    return [f"{start + k}:{port}" for k in range(count)]


def _shards(addresses: list[str], n: int) -> list[list[str]]:
    return [Shard(i, n).select(addresses) for i in range(n)]


@pytest.mark.parametrize(("text", "index", "count"), [("all", 0, 1), ("0/1", 0, 1), ("0/2", 0, 2), (" 3/4 ", 3, 4)])
def test_parse_shard(text: str, index: int, count: int) -> None:
    assert Shard.parse(text) == Shard(index, count)
    assert str(Shard.parse(text)) == ("all" if count == 1 else f"{index}/{count}")


@pytest.mark.parametrize("text", ["", "2", "2/2", "-1/2", "1/0", "a/b", "1/2/3", "½/2", "some"])
def test_parse_shard_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="shard"):
        Shard.parse(text)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("k", [1, 2, 5, 8, 13])
def test_a_consecutive_block_splits_evenly_into_a_partition(k: int, n: int) -> None:
    replicas = _block("10.244.1.7", k)
    shards = _shards(replicas, n)
    assert sorted(a for shard in shards for a in shard) == sorted(replicas)  # none left out, none twice
    assert {len(shard) for shard in shards} <= {k // n, -(-k // n)}
    # The rule "sorted index % n == i", up to which shard is which (a rotation).
    by_index = [replicas[i::n] for i in range(n)]
    assert sorted(map(tuple, shards)) == sorted(map(tuple, by_index))


def test_the_rule_is_the_address_alone_not_its_place_in_the_answer() -> None:
    rng = random.Random(0)
    replicas = _block("172.18.0.2", 6)
    kept = {i: set(Shard(i, 2).select(replicas)) for i in range(2)}
    shuffled = replicas[:]
    for _ in range(5):  # DNS round-robin: the same answer in another order
        rng.shuffle(shuffled)
        assert {i: set(Shard(i, 2).select(shuffled)) for i in range(2)} == kept
    # A replica comes that sorts before all the others, and one goes: the rest stay where they were.
    grown = ["172.18.0.1:50051", *replicas[1:]]
    for i in range(2):
        assert set(Shard(i, 2).select(grown)) - {"172.18.0.1:50051"} == kept[i] - {replicas[0]}
    assert sum(Shard(i, 2).keeps("172.18.0.1:50051") for i in range(2)) == 1
    # With "sorted index % n", that replica would have moved every other one to the other broker:
    # one server then driven by two brokers between their re-reads.
    assert sorted(grown)[0::2] != sorted(replicas)[0::2]


def test_ipv6_replicas_and_every_broker_of_n() -> None:
    replicas = [f"[fd00::{k:x}]:50051" for k in range(1, 10)]
    shards = _shards(replicas, 3)
    assert sorted(a for shard in shards for a in shard) == sorted(replicas)
    assert [len(shard) for shard in shards] == [3, 3, 3]
    assert Shard().select(replicas) == replicas  # "all"


def test_resolve_shard_keeps_host_port_entries_and_shards_a_names_replicas(monkeypatch) -> None:
    answer = _block("10.0.0.10", 5, port=7000)

    def getaddrinfo(host, port, type=0):  # noqa: A002 - socket's own keyword
        assert (host, port) == ("sim-server", 7000)
        ips = [a.rsplit(":", 1)[0] for a in answer]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port)) for ip in reversed(ips)]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    assert resolve_shard("dns:///sim-server:7000", Shard(0, 2)) == [
        "10.0.0.14:7000",
        "10.0.0.12:7000",
        "10.0.0.10:7000",
    ]
    assert resolve_shard("dns:///sim-server:7000", Shard(1, 2)) == ["10.0.0.13:7000", "10.0.0.11:7000"]
    assert resolve_shard("dns:///sim-server:7000", Shard()) == answer[::-1]
    assert resolve_shard("10.0.0.11:7000", Shard(0, 2)) == ["10.0.0.11:7000"]  # a broker's own list: never sharded


def test_broker_config_shard_from_flag_environment_and_file() -> None:
    base = {"simulators": "dns:///sim:50051", "learner": "l:1"}
    assert BrokerConfig(**base).shard == "all" and BrokerConfig(**base).shard_rule == Shard()
    assert BrokerConfig(**base, shard="1/2").shard_rule == Shard(1, 2)
    assert BrokerConfig(**base, shard="0/1").shard == "all"
    with pytest.raises(ValueError, match=r"shard '2/2'"):
        BrokerConfig(**base, shard="2/2")


def _answer(monkeypatch, ips: list[str]) -> None:
    """The name resolves to `ips` (the list may be changed in place: a later answer)."""

    def getaddrinfo(host, port, type=0):  # noqa: A002 - socket's own keyword
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port)) for ip in ips]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_a_broker_takes_its_shard_at_start_and_only_its_new_replicas_later(monkeypatch) -> None:
    monkeypatch.setattr(broker.pool, "SimulatorClient", lambda address, **_: FakeClient(_description()))
    ips = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    _answer(monkeypatch, ips)

    async def go():
        run = BrokerRun(BrokerConfig(simulators=["dns:///sims:7000"], learner="127.0.0.1:1", shard="1/2"))
        try:
            first = await run._first_addresses(time.monotonic() + 5)
            for address in first:
                await run.pool.add(address)
            # The next answer: reordered, one replica gone, one that sorts before all, one after.
            ips[:] = ["10.0.0.5", "10.0.0.4", "10.0.0.1", "10.0.0.0", "10.0.0.2"]
            joined = await run._admit_new_servers()
            return first, joined, [s.address for s in run.pool.servers]
        finally:
            await run.pool.close()
            await run.learner.close()

    first, joined, pool = asyncio.run(go())
    assert first == ["10.0.0.1:7000", "10.0.0.3:7000"]
    # 10.0.0.3 went: it stays, to be marked down and retried by this broker; 10.0.0.5 is this shard's.
    assert joined and pool == ["10.0.0.1:7000", "10.0.0.3:7000", "10.0.0.5:7000"]


def test_a_broker_whose_shard_is_empty_fails_naming_it(monkeypatch) -> None:
    _answer(monkeypatch, ["10.0.0.1"])

    async def go():
        run = BrokerRun(BrokerConfig(simulators=["dns:///sims:7000"], learner="127.0.0.1:1", shard="0/2"))
        try:
            await run._first_addresses(time.monotonic() + 0.5)
        finally:
            await run.learner.close()

    with pytest.raises(RunFailed) as failed:
        asyncio.run(go())
    assert str(failed.value).startswith(
        "shard 0/2 keeps none of the replicas of dns:///sims:7000 (10.0.0.1:7000) after 60 s (broker I of N"
    )


@pytest.mark.slow
def test_brokers_on_their_shards_of_a_name(tmp_path) -> None:
    """Real processes on loopback. dns:///localhost:PORT resolves to one replica, 127.0.0.1, whose
    integer is odd: broker 1 of 2 drives it and trains; broker 0 of 2 keeps none and says so."""
    sim = start_service("sim", ["sim-server", "--slots", "2", "--port", "0"])
    learner = start_service(
        "learner",
        [
            "learner",
            "--port",
            "0",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            "--update-epochs",
            "1",
            "--num-minibatches",
            "1",
        ],
    )
    port = sim.address.rsplit(":", 1)[1]
    assert int(ipaddress.ip_address("127.0.0.1")) % 2 == 1

    def broker(shard: str) -> subprocess.CompletedProcess:
        argv = ["--simulators", f"dns:///localhost:{port}", "--learner", learner.address, "--shard", shard]
        argv += ["--iterations", "1", "--samples-per-iteration", "32", "--startup-timeout-s", "2", "--port", "0"]
        return subprocess.run(
            [sys.executable, "-m", "fast", "broker", *argv], capture_output=True, text=True, timeout=120
        )

    try:
        none = broker("0/2")
        assert none.returncode != 0
        assert f"shard 0/2 keeps none of the replicas of dns:///localhost:{port} (127.0.0.1:{port})" in none.stderr
        one = broker("1/2")
        assert one.returncode == 0, one.stderr[-2000:]
        assert f"shard 1/2: 1 simulator(s): 127.0.0.1:{port}" in one.stderr
    finally:
        for service in (sim, learner):
            service.stop()


def test_fast_train_gives_every_broker_a_name_whole_with_its_shard(tmp_path) -> None:
    """`fast train --ranks R --simulators dns:///NAME:PORT`: each broker gets the name and the shard r/R
    (HOST:PORT entries dealt round-robin beside it); with HOST:PORT alone, no shard and one server each
    at least."""
    from jobs.train.config import TrainConfig

    name, plain = "dns:///sims.example:50051", ["10.0.0.5:50051", "10.0.0.6:50051", "10.0.0.7:50051"]
    cfg = TrainConfig(ranks=2, simulators=[plain[0], name], runs_dir=str(tmp_path))
    assert [cfg.broker_simulators(cfg.simulators, r) for r in (0, 1)] == [([plain[0], name], "0/2"), ([name], "1/2")]
    argv = cfg.broker_config([name], "127.0.0.1:1", tmp_path, 10, rank=1, shard="1/2").to_argv()
    assert argv[argv.index("--shard") + 1] == "1/2" and argv[argv.index("--simulators") + 1] == name
    assert TrainConfig(ranks=4, simulators=[name], runs_dir=str(tmp_path)).ranks == 4  # a name's replicas: any R

    cfg = TrainConfig(ranks=2, simulators=plain, runs_dir=str(tmp_path))
    assert [cfg.broker_simulators(cfg.simulators, r) for r in (0, 1)] == [
        ([plain[0], plain[2]], "all"),
        ([plain[1]], "all"),
    ]
    with pytest.raises(ValueError, match="ranks is 4 but the run has 3 simulator server"):
        TrainConfig(ranks=4, simulators=plain, runs_dir=str(tmp_path))

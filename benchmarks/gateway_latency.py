"""What the gateway adds: REST status and Prometheus scrapes against the same figures straight over gRPC,
and how late a server-sent event arrives after its iteration ended, on a live local stack. The floor
printed first is an HTTP round trip to the gateway that asks no upstream (urllib, a new connection
per call, as every REST figure here).

    python benchmarks/gateway_latency.py [--requests 200]
    python -m benchmarks.gateway_latency [the same flags]   # the same command, from the repository root

Starts one simulator server, the learner, the broker and the gateway on loopback (the same stack as
tests/live_stack.py), lets the run go, and prints medians and 95th percentiles side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import stub_for  # noqa: E402  (sets a token of its own for the session)
from live_stack import live_stack  # noqa: E402

from fast.v1 import broker_pb2, broker_pb2_grpc  # noqa: E402


def _percentiles(samples_s: list[float]) -> str:
    ordered = sorted(samples_s)
    p95 = ordered[int(0.95 * (len(ordered) - 1))]
    return f"median {1e3 * statistics.median(ordered):6.2f} ms   p95 {1e3 * p95:6.2f} ms"


def _timed(call, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        began = time.perf_counter()
        call()
        samples.append(time.perf_counter() - began)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--events", type=int, default=20)
    args = parser.parse_args()
    if args.requests < 1 or args.events < 1:
        parser.error("--requests and --events must be at least 1")
    with tempfile.TemporaryDirectory() as tmp, live_stack(Path(tmp), samples_per_iteration=256) as stack:
        stack.wait_for(lambda s: s["iteration"] >= 2, what="two iterations")

        def rest(path: str) -> bytes:
            with urllib.request.urlopen(stack.url + path, timeout=30) as answer:
                return answer.read()

        with stub_for(stack.broker.address, broker_pb2_grpc.BrokerStub) as broker:
            grpc_status = _timed(
                lambda: broker.GetRunStatus(broker_pb2.GetRunStatusRequest(), timeout=10), args.requests
            )
        http_floor = _timed(lambda: rest("/healthz"), args.requests)  # an HTTP call that asks no upstream
        rest_status = _timed(lambda: rest("/v1/status"), args.requests)
        scrape = _timed(lambda: rest("/metrics"), max(args.requests // 4, 1))

        delays = []
        with urllib.request.urlopen(
            stack.url + f"/v1/events?since={stack.status()['iteration']}", timeout=120
        ) as events:
            for line in events:
                if line.startswith(b"data: {") and len(delays) < args.events:
                    metrics = json.loads(line[len(b"data: ") :])
                    delays.append(time.time() - metrics["time"])
                if len(delays) >= args.events:
                    break
    print(f"floor: GET /healthz (HTTP, no upstream):   {_percentiles(http_floor)}   ({args.requests} calls)")
    print(f"broker GetRunStatus over gRPC (sync stub):  {_percentiles(grpc_status)}   ({args.requests} calls)")
    print(f"GET /v1/status (broker + learner, JSON):    {_percentiles(rest_status)}   ({args.requests} calls)")
    print(f"GET /metrics (Prometheus exposition):       {_percentiles(scrape)}   ({len(scrape)} scrapes)")
    print(f"SSE event after its iteration ended:        {_percentiles(delays)}   ({len(delays)} events)")


if __name__ == "__main__":
    main()

"""Watching a running broker: its status over gRPC, its metrics file, a progress bar, TensorBoard.

The broker is the source of truth: GetRunStatus gives the live iteration and last metrics
(the progress bar), metrics.jsonl the durable per-iteration record (converted line by line
to TensorBoard scalars, so TensorBoard and the report show the same numbers).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import grpc
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from fast.rpc import Credentials, open_blocking_channel
from fast.v1 import broker_pb2 as pb
from fast.v1 import broker_pb2_grpc as pb_grpc


class MetricsTail:
    """New complete lines of a growing JSONL file, parsed; a half-written last line waits."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._offset = 0

    def read_new(self) -> list[dict]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # only whole lines; the broker may be mid-write
        self._offset += end
        return [json.loads(line) for line in data[:end].decode().splitlines() if line.strip()]

    def follow_truncation(self) -> None:
        """The file was cut back to a prefix of itself (a restarted group's, jobs/train/restart.py): read on
        from its new end if the tail had passed it, so that no dropped line is read again."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        self._offset = min(self._offset, size)


class TensorBoardSink:
    """One TensorBoard step per iteration: every numeric metric as a scalar, episode lengths as a histogram.

    The event file is written with tensorboard's own EventFileWriter, not torch's SummaryWriter: the same
    file (name, first file_version event, scalars as simple_value, the histogram torch's add_histogram
    builds with its default bins), without importing torch (seconds of CPU) into `fast train`'s process."""

    def __init__(self, log_dir: Path) -> None:
        # Imported here: tensorboard is only needed by a training run, not by the services. The writer
        # loads tensorflow only if installed (tensorboard.compat.tf), else its own stub; never torch.
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        # SummaryWriter's defaults (max_queue 10, flush_secs 120, no filename suffix).
        self._writer = EventFileWriter(str(log_dir), 10, 120, "")

    def write(self, metrics: dict) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        step = int(metrics["iteration"])
        walltime = metrics.get("time")

        def add(value: Summary.Value) -> None:  # SummaryWriter.add_summary: one event per value
            wall_time = time.time() if walltime is None else walltime
            self._writer.add_event(Event(summary=Summary(value=[value]), wall_time=wall_time, step=step))

        for tag, value in scalars(metrics):
            add(Summary.Value(tag=tag, simple_value=value))
        lengths = metrics.get("episode_lengths") or []
        if lengths:
            add(Summary.Value(tag="sampling/episode_lengths", histo=histogram(np.asarray(lengths, dtype=float))))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def _tensorflow_bins() -> np.ndarray:
    """torch's SummaryWriter.default_bins (add_histogram's bins="tensorflow"): 0 and +-1e-12 * 1.1^k up to 1e20."""
    v, buckets = 1e-12, []
    while v < 1e20:  # the same float products, in the same order, as torch's loop
        buckets.append(v)
        v *= 1.1
    return np.array([-b for b in reversed(buckets)] + [0.0] + buckets)


_BINS = _tensorflow_bins()


def histogram(values: np.ndarray):
    """The HistogramProto of torch.utils.tensorboard.summary.make_histogram(values, default bins, max_bins=None):
    only the buckets from just left of the first non-empty one to the last non-empty one."""
    from tensorboard.compat.proto.summary_pb2 import HistogramProto

    values = np.asarray(values, dtype=float).reshape(-1)
    if values.size == 0:
        raise ValueError("The input has no element.")
    counts, limits = np.histogram(values, bins=_BINS)
    cum_counts = np.cumsum(np.greater(counts, 0))
    start, end = np.searchsorted(cum_counts, [0, cum_counts[-1] - 1], side="right")
    start, end = int(start), int(end) + 1
    # TensorBoard keeps only right bin limits: an empty bin on the left keeps the leftmost limit.
    counts = counts[start - 1 : end] if start > 0 else np.concatenate([[0], counts[:end]])
    limits = limits[start : end + 1]
    return HistogramProto(
        min=values.min(),
        max=values.max(),
        num=len(values),
        sum=values.sum(),
        sum_squares=values.dot(values),
        bucket_limit=limits.tolist(),
        bucket=counts.tolist(),
    )


_NOT_SCALARS = {"iteration", "time", "num_slots"}


def scalars(metrics: dict) -> list[tuple[str, float]]:
    """(tag, value) of every finite number: top-level ones under sampling/, nested dicts under their key."""
    out: list[tuple[str, float]] = []
    for key, value in metrics.items():
        if isinstance(value, dict):
            out += [(f"{key}/{k}", float(v)) for k, v in value.items() if _finite(v)]
        elif key not in _NOT_SCALARS and _finite(value):
            out.append((f"sampling/{key}", float(value)))
    return out


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class BrokerStatus:
    """GetRunStatus of one broker, each call with a short deadline; None when it does not answer.

    `credentials`: the run's token (None: the environment's)."""

    def __init__(self, address: str, credentials: Credentials | None = None, timeout_s: float = 1.0) -> None:
        self.timeout_s = timeout_s
        self._channel = open_blocking_channel(address, credentials=credentials)
        self._stub = pb_grpc.BrokerStub(self._channel)

    def poll(self) -> pb.GetRunStatusResponse | None:
        try:
            return self._stub.GetRunStatus(pb.GetRunStatusRequest(), timeout=self.timeout_s)
        except grpc.RpcError:
            return None

    def close(self) -> None:
        self._channel.close()


def describe_iteration(metrics: dict, *, compact: bool = False) -> str:
    """One line about an iteration: return, effective throughput, validity (eta) and time efficiency."""
    ret = metrics.get("episode_return_mean")
    ret_text = f"{ret:.2f}" if isinstance(ret, (int, float)) and math.isfinite(ret) else "-"
    if compact:  # fits an 80-column progress bar
        return (
            f"return {ret_text}  {metrics.get('effective_throughput', 0.0):,.0f} valid/s  "
            f"validity {metrics.get('validity', 0.0):.2f}"
        )
    return (
        f"return {ret_text}  effective {metrics.get('effective_throughput', 0.0):,.0f} valid steps/s  "
        f"validity {metrics.get('validity', 0.0):.2f}  time efficiency {metrics.get('time_efficiency', 0.0):.3f}"
    )


class ProgressView:
    """A rich progress bar on a terminal; one plain line per iteration otherwise (logs, CI)."""

    def __init__(self, console: Console, total: int, title: str) -> None:
        self.console = console
        self.total = total
        self._live = console.is_terminal
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=16),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            disable=not self._live,
        )
        self._task = self._progress.add_task(title, total=total, stats="starting")
        self._shown = 0

    def __enter__(self) -> "ProgressView":
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

    def update(self, iteration: int, metrics: dict | None) -> None:
        stats = describe_iteration(metrics, compact=True) if metrics else "waiting for the first iteration"
        self._progress.update(self._task, completed=iteration, stats=stats)
        if not self._live and metrics and iteration > self._shown:
            self._shown = iteration
            self.console.print(f"iteration {iteration}/{self.total}  {describe_iteration(metrics)}", highlight=False)

    def note(self, message: str) -> None:
        self.console.print(message, highlight=False)

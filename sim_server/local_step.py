"""The local step socket: StepStream's exchange on a Unix domain socket, for a broker on this machine.

Why: at a lock-step step's message sizes, a gRPC StepStream round trip costs several times what
the bytes do (HTTP/2 framing, and on each side the C core's completion handed to the event loop
by another thread); a Unix socket pays one write and one read. The broker steps a server over
it when the server's Describe names one and the broker can open it (same machine); otherwise,
or when a server has none, it steps over gRPC as always (docs/simulator_api.md).

What it keeps from gRPC: the messages (StepRequest in, StepResponse out, framed by fast/frames.py),
one request in flight per connection answered in order, the run token (the first frame, compared
in constant time; a wrong one gets UNAUTHENTICATED and the connection closes before any slot is
touched), the message size limit, and the status codes of the domain errors (an error frame,
then the connection closes, as a StepStream ends with its status). What guards it besides the
token: the socket lives in a fresh directory only the server's user may enter (mode 0700), and a
Unix socket is never reachable from another machine.

A server that is killed (SIGKILL, OOM) cannot remove its directory. Each directory therefore
holds an `owner` file (the server's pid and pid namespace), and a server that starts removes the
directories beside its own whose owner is gone: the pid no longer runs in the same namespace.
A directory without that file, another user's, or one from another namespace is never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import secrets
import shutil
import tempfile
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError

from fast import frames, tensor
from fast.lifecycle import process_alive
from fast.v1 import simulator_pb2 as pb
from sim_server.errors import SimError
from sim_server.servicer import SimulatorServicer, status_of

log = logging.getLogger("fast.sim_server.local_step")


class LocalStepSocket:
    """Serves `servicer`'s Step on a Unix socket in a private directory; `close()` removes both."""

    def __init__(self, servicer: SimulatorServicer, token: str, *, max_message_bytes: int) -> None:
        self.servicer = servicer
        self._token = token.encode()
        self.max_message_bytes = max_message_bytes
        self._server: asyncio.AbstractServer | None = None
        self._directory: Path | None = None
        # A random name: a path that some other server on another machine happens to share (the
        # directory's name is random too) never leads a broker to the wrong server's slots.
        # 64 bits, short: a Unix socket's whole path has at most 107 bytes.
        self._name = f"step-{secrets.token_hex(8)}.sock"
        self._connections: set[asyncio.Task] = set()

    @property
    def path(self) -> str:
        return str(self._directory / self._name) if self._directory else ""

    async def start(self, directory: str | None = None) -> str:
        """Bind in a new private directory under `directory` (None: the system's temporary one) and
        advertise the socket in Describe; returns its path."""
        self._directory = Path(tempfile.mkdtemp(prefix=DIRECTORY_PREFIX, dir=directory))  # mode 0700
        try:
            (self._directory / OWNER_FILE).write_text(_owner_line(os.getpid()))
            removed = sweep_stale_directories(self._directory.parent, keep=self._directory)
            if removed:
                log.info("local step socket: removed %d directories of servers that are gone", removed)
            self._server = await asyncio.start_unix_server(self._serve, path=self.path, limit=1 << 16)
            os.chmod(self.path, 0o600)
        except BaseException:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None
            raise
        self.servicer.local_step_socket = self.path
        return self.path

    async def close(self) -> None:
        self.servicer.local_step_socket = ""
        if self._server is not None:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        try:
            await self._exchange(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away: nothing was half-done, a step answers or is not read
        except frames.FrameError as exc:
            await _refuse(writer, grpc.StatusCode.INVALID_ARGUMENT, f"{exc}; send frames as fast/frames.py describes")
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        kind, token = await frames.read_frame(reader, max_bytes=4096)
        if kind != frames.HELLO or not hmac.compare_digest(token, self._token):
            log.warning("local step socket: a connection without the run token was refused")
            await _refuse(
                writer,
                grpc.StatusCode.UNAUTHENTICATED,
                "the first frame must be HELLO with the run token (docs/security.md)",
            )
            return
        writer.write(frames.encode(frames.READY))
        while True:
            kind, payload = await frames.read_frame(reader, self.max_message_bytes)
            if kind != frames.STEP:
                await _refuse(writer, grpc.StatusCode.INVALID_ARGUMENT, f"expected a STEP frame, got kind {kind}")
                return
            try:
                request = pb.StepRequest.FromString(payload)
            except DecodeError:
                await _refuse(writer, grpc.StatusCode.INVALID_ARGUMENT, "the STEP frame is not a fast.v1.StepRequest")
                return
            try:
                answer = await self.servicer.step_answer(request)
            except (SimError, tensor.TensorError, asyncio.TimeoutError) as exc:
                await _refuse(writer, *status_of(exc))
                return
            writer.write(frames.encode(frames.ANSWER, answer.SerializeToString()))


DIRECTORY_PREFIX = "fast-sim-"
OWNER_FILE = "owner"


def _pid_namespace() -> str:
    """This process's pid namespace (Linux), or "" where there is no such thing to read."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _owner_line(pid: int) -> str:
    return f"{pid} {_pid_namespace()}\n"


def sweep_stale_directories(parent: Path, *, keep: Path | None = None) -> int:
    """Remove the socket directories under `parent` left by servers of this user that are gone.

    Gone means: the directory's owner file names a pid of this pid namespace that no longer runs.
    A reused pid keeps a stale directory (harmless: a later sweep gets it); nothing that might be
    live is removed. Returns how many directories went."""
    removed = 0
    namespace = _pid_namespace()
    try:
        candidates = list(parent.glob(DIRECTORY_PREFIX + "*"))
    except OSError:
        return 0
    for directory in candidates:
        if directory == keep:
            continue
        try:
            if directory.is_symlink() or not directory.is_dir() or directory.stat().st_uid != os.getuid():
                continue
            pid_text, _, owner_namespace = (directory / OWNER_FILE).read_text().strip().partition(" ")
            pid = int(pid_text)
        except (OSError, ValueError):
            continue  # no owner file (yet, or not ours to judge): leave it
        if owner_namespace != namespace or pid <= 0 or process_alive(pid):
            continue
        shutil.rmtree(directory, ignore_errors=True)
        removed += 1
    return removed


async def _refuse(writer: asyncio.StreamWriter, code: grpc.StatusCode, message: str) -> None:
    """Send an ERROR frame (the caller then closes), as a gRPC stream ends with its status."""
    with contextlib.suppress(ConnectionError):
        writer.write(frames.encode_error(code.value[0], message))
        await writer.drain()

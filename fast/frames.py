"""Length-prefixed frames over an asyncio stream: the local step socket's wire format.

A simulator server on the broker's own machine may serve the StepStream exchange over a Unix
domain socket as well as over gRPC (sim_server/local_step.py, docs/simulator_api.md). gRPC's
per-message machinery (HTTP/2 framing, the C core's completion queue handed to the event loop
through another thread) costs several times what the bytes do at a lock-step step's message
sizes; a plain stream pays one write and one read. The messages stay the protos' own
(StepRequest, StepResponse), so decoding and checking are the same on both paths.

A frame is a 5-byte header, the payload's length (uint32, little-endian) and its kind (uint8),
then the payload. Kinds:
  HELLO   client -> server, first frame: the run token (UTF-8)
  READY   server -> client: the token was accepted (empty)
  STEP    client -> server: a serialized fast.v1.StepRequest
  ANSWER  server -> client: the serialized fast.v1.StepResponse to the STEP before it
  ERROR   server -> client, then the server closes: grpc status code (uint8) and a UTF-8 message
"""

from __future__ import annotations

import asyncio
import struct

HEADER = struct.Struct("<IB")
HELLO, READY, STEP, ANSWER, ERROR = 1, 2, 3, 4, 5
KINDS = frozenset({HELLO, READY, STEP, ANSWER, ERROR})
MAX_ERROR_MESSAGE = 1000  # characters of an ERROR frame's message kept, on either side


class FrameError(ValueError):
    """A frame that breaks the format (unknown kind, longer than the limit)."""


def encode(kind: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload), kind) + payload


def encode_error(code: int, message: str) -> bytes:
    return encode(ERROR, bytes([code]) + message[:MAX_ERROR_MESSAGE].encode("utf-8", "replace"))


def decode_error(payload: bytes) -> tuple[int, str]:
    """(status code value, message) of an ERROR frame's payload."""
    if not payload:
        return 2, "the server sent an empty error frame"  # 2: UNKNOWN
    return payload[0], payload[1:].decode("utf-8", "replace")[:MAX_ERROR_MESSAGE]


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> tuple[int, bytes]:
    """The next (kind, payload); asyncio.IncompleteReadError when the stream ends first,
    FrameError (before reading the payload) for an unknown kind or a payload over `max_bytes`."""
    length, kind = HEADER.unpack(await reader.readexactly(HEADER.size))
    if kind not in KINDS:
        raise FrameError(f"unknown frame kind {kind}")
    if length > max_bytes:
        raise FrameError(f"a frame of {length} bytes is over the limit of {max_bytes}")
    return kind, (await reader.readexactly(length) if length else b"")

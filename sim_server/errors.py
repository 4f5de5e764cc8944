"""Domain errors of a simulator server; the servicer maps each kind to a gRPC status code."""

from __future__ import annotations

from enum import Enum


class ErrorKind(Enum):
    INVALID_ARGUMENT = "INVALID_ARGUMENT"  # malformed request: shapes, dtypes, NaN, bounds
    NOT_FOUND = "NOT_FOUND"  # unknown slot or clip id
    FAILED_PRECONDITION = "FAILED_PRECONDITION"  # valid request, wrong state (no live episode)
    UNAVAILABLE = "UNAVAILABLE"  # the worker process holding a slot is gone (sim_server/workers.py)
    INTERNAL = "INTERNAL"  # the env raised while serving a valid request


class SimError(Exception):
    """A request the server refuses; nothing was changed. The message names the fix."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message

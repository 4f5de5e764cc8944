"""Domain errors of the learner service; the servicer maps each kind to a gRPC status code."""

from __future__ import annotations

from enum import Enum


class ErrorKind(Enum):
    INVALID_ARGUMENT = "INVALID_ARGUMENT"  # malformed request: missing tensor, shape, dtype, space
    FAILED_PRECONDITION = "FAILED_PRECONDITION"  # valid request, wrong state: stale version, not initialised
    UNIMPLEMENTED = "UNIMPLEMENTED"  # a feature this learner's installation lacks (ONNX export without onnx)
    UNAVAILABLE = "UNAVAILABLE"  # the group of learner ranks failed (a rank gone or silent): it must restart


class LearnerError(Exception):
    """A request the learner refuses; the policy, its version and the optimiser are unchanged.

    The message names the offending field or state and the fix.
    """

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def invalid_argument(message: str) -> LearnerError:
    return LearnerError(ErrorKind.INVALID_ARGUMENT, message)


def failed_precondition(message: str) -> LearnerError:
    return LearnerError(ErrorKind.FAILED_PRECONDITION, message)


def unimplemented(message: str) -> LearnerError:
    return LearnerError(ErrorKind.UNIMPLEMENTED, message)


def unavailable(message: str) -> LearnerError:
    return LearnerError(ErrorKind.UNAVAILABLE, message)

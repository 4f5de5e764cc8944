"""The run token: one shared secret that every call to a FAST service must carry.

Where it comes from (`run_token`), first match wins, both set is an error:
  FAST_AUTH_TOKEN        the token itself (Docker Compose passes it this way);
  FAST_AUTH_TOKEN_FILE   a file holding it (Kubernetes mounts a Secret; `fast train` writes
                         runs/<name>/token for the services it starts);
  neither                the user's default token file, $FAST_HOME/token (default
                         ~/.fast/token), created 0600 by the first process that needs it, so
                         every service and client of one user agrees with zero configuration.
Never from a command-line flag: flags show in `ps`.

On the wire it is gRPC metadata `authorization: Bearer <token>`. `TokenCheck`, a server
interceptor, requires it on every call except the standard health and reflection services
(container probes and `fast health` need no secret). Clients send `call_metadata` with every
call (fast/rpc.py: RpcClient's stubs; `blocking_interceptor` on synchronous channels).
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import Mapping
from pathlib import Path

import grpc

TOKEN_ENV = "FAST_AUTH_TOKEN"
TOKEN_FILE_ENV = "FAST_AUTH_TOKEN_FILE"
HOME_ENV = "FAST_HOME"  # where the default token file lives; default ~/.fast
TOKEN_VARIABLES = frozenset({TOKEN_ENV, TOKEN_FILE_ENV})

METADATA_KEY = "authorization"
SCHEME = "Bearer"

# Services any caller may use: the standard health service (probes, `fast health`) and reflection
# (grpcurl; the schema is public in protos/ anyway). Everything else needs the token, services
# added later included.
OPEN_SERVICES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)

HOW_TO_SUPPLY = (
    f"send metadata '{METADATA_KEY}: {SCHEME} <token>' with the run's token; FAST clients take it from "
    f"{TOKEN_ENV}, from the file named by {TOKEN_FILE_ENV}, or from the default file ~/.fast/token "
    "(docs/security.md)"
)

# A header value: printable ASCII without spaces, which every token_urlsafe token is.
_TOKEN_CHARS = re.compile(r"^[\x21-\x7e]+$")

log = logging.getLogger("fast.auth")


class AuthError(ValueError):
    """No usable run token; the message names the variable or file and the fix."""


# -- where the token comes from -------------------------------------------------------------------


def new_token() -> str:
    """32 random bytes, URL-safe base64: fits a header as it is."""
    return secrets.token_urlsafe(32)


def default_token_file(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    home = env.get(HOME_ENV)
    return (Path(home) if home else Path.home() / ".fast") / "token"


def run_token(environ: Mapping[str, str] | None = None) -> str:
    """The run token of this process's environment (module docstring); AuthError when unusable."""
    env = os.environ if environ is None else environ
    value, path = env.get(TOKEN_ENV), env.get(TOKEN_FILE_ENV)
    if value is not None and path is not None:
        raise AuthError(f"both {TOKEN_ENV} and {TOKEN_FILE_ENV} are set; set only one of them")
    if value is not None:
        return _checked(value.strip(), TOKEN_ENV)
    if path is not None:
        if not path.strip():
            raise AuthError(f"{TOKEN_FILE_ENV} is set but empty; give the path of a file holding the run token")
        return read_token_file(Path(path))
    return ensure_token_file(default_token_file(env))


def read_token_file(path: Path) -> str:
    """The token in `path`, stripped of surrounding whitespace; AuthError if missing, empty or too open."""
    try:
        info = os.stat(path)  # follows links: a Kubernetes Secret's file is a link into ..data/
        _check_private(path, info)
        text = path.read_text()
    except FileNotFoundError:
        raise AuthError(f"token file {path} does not exist; create it or point {TOKEN_FILE_ENV} elsewhere") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AuthError(f"token file {path} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    return _checked(text.strip(), f"token file {path}")


def _check_private(path: Path, info: os.stat_result) -> None:
    """Only its owner may read the file: no permission for others, and none for the group either,
    except read on a file that root provisioned for a process that is not root. That exception is
    a Kubernetes Secret volume with fsGroup, which the kubelet always makes group-readable
    (PostgreSQL accepts its keys on the same terms)."""
    mode = stat.S_IMODE(info.st_mode)
    group_allowed = stat.S_IRGRP if info.st_uid == 0 and os.geteuid() != 0 else 0
    if mode & (stat.S_IRWXO | (stat.S_IRWXG & ~group_allowed)):
        raise AuthError(
            f"token file {path} is open to group or others (mode {mode:04o}); "
            f"only its owner may read it: run chmod 600 {path}"
        )


def _checked(token: str, source: str) -> str:
    if not token:
        raise AuthError(f"{source} holds an empty token; put a long random string there, e.g. from `{_SUGGEST}`")
    if not _TOKEN_CHARS.match(token):
        raise AuthError(
            f"{source} holds a token with spaces or characters a gRPC header cannot carry; "
            f"use printable ASCII, e.g. from `{_SUGGEST}`"
        )
    return token


_SUGGEST = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'


def write_token_file(path: Path, token: str | None = None) -> str:
    """Write a fresh token (or `token`) to a new file `path`, mode 0600; FileExistsError if it exists."""
    token = _checked(token if token is not None else new_token(), "the token to write")
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(token + "\n")
    return token


def ensure_token_file(path: Path) -> str:
    """The token in `path`, which is created (directory 0700, file 0600) with a fresh token if missing.

    Processes racing to create it all end with the same token: each writes a private temporary
    file and links it into place, which fails for all but the first; the others read the winner's.
    A reader never sees a half-written file.
    """
    try:
        return read_token_file(path)
    except AuthError:
        if path.exists():
            raise
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    write_token_file(draft)
    try:
        os.link(draft, path)
    except FileExistsError:
        pass  # another process won the race: its token is the one
    finally:
        draft.unlink(missing_ok=True)
    return read_token_file(path)


# -- the server's check ---------------------------------------------------------------------------


def bearer(token: str) -> str:
    """The metadata value that carries `token`."""
    return f"{SCHEME} {token}"


class _RefusalLog:
    """One warning line per refused call, at most one per `every_s`: a flood cannot fill the log.
    The line names the method and the peer, never a token."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s = every_s
        self._quiet_until = 0.0
        self._suppressed = collections.Counter()

    def note(self, method: str, peer: str, reason: str) -> None:
        now = time.monotonic()
        if now < self._quiet_until:
            self._suppressed[reason] += 1
            return
        since = ""
        if self._suppressed:
            counts = ", ".join(f"{n} {why}" for why, n in sorted(self._suppressed.items()))
            since = f" (since the last such line, also refused: {counts})"
        log.warning("refused %s from %s: %s%s", method, peer, reason, since)
        self._suppressed.clear()
        self._quiet_until = now + self.every_s


class TokenCheck(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED for every call without `authorization: Bearer <token>`, except OPEN_SERVICES."""

    def __init__(self, token: str, *, log_every_s: float = 10.0) -> None:
        self._expected = _checked(token, "the server's run token").encode()
        self._refusals = _RefusalLog(log_every_s)

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(OPEN_SERVICES):
            return handler
        presented = _presented_token(handler_call_details.invocation_metadata)
        if presented is not None and hmac.compare_digest(presented, self._expected):
            return handler
        reason = "no run token" if presented is None else "wrong run token"
        return _refusing(handler, method, reason, self._refusals)


def _presented_token(metadata) -> bytes | None:
    """The token of the first `authorization` entry, as bytes (None when there is no Bearer entry)."""
    for key, value in metadata or ():
        if key.lower() != METADATA_KEY:
            continue
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() != SCHEME.lower():
            return None
        return token.strip().encode("utf-8", "replace")
    return None


_FIRST_MESSAGE_WAIT_S = 1.0  # a refused request stream waits this long for its first message


def _refusing(handler: grpc.RpcMethodHandler, method: str, reason: str, refusals: _RefusalLog):
    """A handler of the same shape as `handler` that ends the call with UNAUTHENTICATED."""
    message = f"{reason}: {HOW_TO_SUPPLY}"

    async def refuse(_request, context: grpc.aio.ServicerContext):
        refusals.note(method, context.peer(), reason)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def refuse_after_first_message(requests, context: grpc.aio.ServicerContext):
        # Ending a client stream before its first message has landed races the client's write, and
        # gRPC core then reports INTERNAL to the client instead of our status: let it land (briefly).
        try:
            await asyncio.wait_for(anext(aiter(requests)), _FIRST_MESSAGE_WAIT_S)
        except (asyncio.TimeoutError, StopAsyncIteration, grpc.RpcError):
            pass
        await refuse(requests, context)

    if handler.request_streaming and handler.response_streaming:
        make = grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        make = grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        make = grpc.unary_stream_rpc_method_handler
    else:
        make = grpc.unary_unary_rpc_method_handler
    return make(
        refuse_after_first_message if handler.request_streaming else refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


# -- the client's side ----------------------------------------------------------------------------


def _with_token(metadata, value: str) -> list[tuple[str, str]]:
    kept = [(k, v) for k, v in (metadata or ()) if k.lower() != METADATA_KEY]
    return [*kept, (METADATA_KEY, value)]


def call_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The metadata that carries `token`, for the `metadata=` of a call."""
    return ((METADATA_KEY, bearer(_checked(token, "the client's run token"))),)


class _CallDetails(
    collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready")),
    grpc.ClientCallDetails,
):
    pass


class _BlockingBearer(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def __init__(self, token: str) -> None:
        self._value = bearer(_checked(token, "the client's run token"))

    def _details(self, details: grpc.ClientCallDetails) -> _CallDetails:
        return _CallDetails(
            details.method,
            details.timeout,
            _with_token(details.metadata, self._value),
            details.credentials,
            getattr(details, "wait_for_ready", None),
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


def blocking_interceptor(token: str):
    """For synchronous channels (grpc.intercept_channel): attach `token` to every call."""
    return _BlockingBearer(token)

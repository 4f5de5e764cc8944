"""A run token of a job's own, for the services it starts and its own calls to them.

`fast train` writes one per run (runs/<name>/token); `fast compare` and the benchmarks, which
start their own simulator servers, use a temporary one. The services get the file's path in
FAST_AUTH_TOKEN_FILE (`JobToken.env`, given to jobs/processes.py), the job's own clients the
token itself (`JobToken.credentials`); the token is never written to a config (`fast train` prints it
once, in the dashboard URL's fragment).

A job on external simulators (--simulators) cannot hand them a token of its own: it uses the
token of its environment instead (`environment_job_token`), for its calls and for every service it
starts, so that servers the user started with that same token accept the run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fast import auth
from fast.rpc import Credentials


@dataclass(frozen=True)
class JobToken:
    path: Path | None  # mode 0600; None for a token given in FAST_AUTH_TOKEN itself
    credentials: Credentials
    inherited: bool = False  # the environment's token: children inherit it as they are
    origin: str = ""  # where an inherited token comes from, in words (never the token)

    @property
    def env(self) -> dict[str, str]:
        """The variables that give a child service this token (none: an inherited one is theirs already)."""
        return {} if self.inherited else {auth.TOKEN_FILE_ENV: str(self.path)}

    @property
    def source(self) -> str:
        """Where the token comes from, in words, never the token itself."""
        return self.origin or f"the job's own token file {self.path}"


def write_job_token(path: Path) -> JobToken:
    """A fresh token in the new file `path` (FileExistsError if it exists)."""
    return JobToken(Path(path), Credentials(auth.write_token_file(Path(path))))


def environment_job_token() -> JobToken:
    """The token of this process's environment (fast/auth.py: run_token), which every child inherits.

    auth.AuthError (a ValueError naming the variable or file) when it is unusable."""
    token = auth.run_token()
    named = os.environ.get(auth.TOKEN_FILE_ENV)
    if os.environ.get(auth.TOKEN_ENV) is not None:
        path, origin = None, f"{auth.TOKEN_ENV} (the token itself)"
    elif named is not None:
        path, origin = Path(named), f"{auth.TOKEN_FILE_ENV}={named}"
    else:
        path = auth.default_token_file()
        origin = f"the default token file {path} (neither {auth.TOKEN_ENV} nor {auth.TOKEN_FILE_ENV} is set)"
    return JobToken(path, Credentials(token), inherited=True, origin=origin)


@contextmanager
def temporary_job_token() -> Iterator[JobToken]:
    """A fresh token in a private temporary directory, removed on exit."""
    directory = Path(tempfile.mkdtemp(prefix="fast-token-"))  # mode 0700
    try:
        yield write_job_token(directory / "token")
    finally:
        shutil.rmtree(directory, ignore_errors=True)

"""A run token of a job's own, for the services it starts and its own calls to them.

`fast train` writes one per run (runs/<name>/token); `fast compare` and the benchmarks, which
start their own simulator servers, use a temporary one. The services get the file's path in
FAST_AUTH_TOKEN_FILE (`JobToken.env`, given to jobs/processes.py), the job's own clients the
token itself (`JobToken.credentials`); the token is never written to a config (`fast train` prints it
once, in the dashboard URL's fragment).
"""

from __future__ import annotations

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
    path: Path  # mode 0600
    credentials: Credentials

    @property
    def env(self) -> dict[str, str]:
        """The variables that give a child service this token."""
        return {auth.TOKEN_FILE_ENV: str(self.path)}


def write_job_token(path: Path) -> JobToken:
    """A fresh token in the new file `path` (FileExistsError if it exists)."""
    return JobToken(Path(path), Credentials(auth.write_token_file(Path(path))))


@contextmanager
def temporary_job_token() -> Iterator[JobToken]:
    """A fresh token in a private temporary directory, removed on exit."""
    directory = Path(tempfile.mkdtemp(prefix="fast-token-"))  # mode 0700
    try:
        yield write_job_token(directory / "token")
    finally:
        shutil.rmtree(directory, ignore_errors=True)

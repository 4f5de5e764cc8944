"""`fast sim-check HOST:PORT`: a conformance check of a simulator server against the fast.v1 contract.

It speaks fast.v1 like every FAST client (fast/rpc.py, the run token of fast/auth.py) and imports
nothing of the server's: `checks.py` holds the checks (one async function per group of rows),
`target.py` the connection and the broker's verdicts on answers, `report.py` the table and JSON.
docs/sim_check.md says what each row checks.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from rich.console import Console

from fast import auth
from fast.rpc import Credentials
from jobs.sim_check.checks import Report, Result, run_checks
from jobs.sim_check.report import render, summary_line, write_json
from jobs.sim_check.target import Options, UsageError

__all__ = ["Options", "Report", "Result", "UsageError", "main", "run_checks", "summary_line"]


def credentials_for(token_file: Path | None) -> Credentials:
    """The token in `token_file`, else the environment's (FAST_AUTH_TOKEN, FAST_AUTH_TOKEN_FILE, ~/.fast/token)."""
    try:
        return Credentials(auth.read_token_file(token_file)) if token_file is not None else Credentials.from_env()
    except auth.AuthError as exc:
        raise UsageError(str(exc)) from None


def main(address: str, options: Options, *, token_file: Path | None = None, json_path: Path | None = None) -> int:
    """Run every check, print the table and figures, write `json_path`; the exit code: 0 when nothing
    failed, 1 when a check failed, 2 when the server cannot be checked (unreachable, token, --pid)."""
    console = Console() if sys.stdout.isatty() else Console(width=160)
    try:
        report = asyncio.run(run_checks(address, credentials_for(token_file), options))
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    render(report, console)
    if json_path is not None:
        try:
            write_json(report, json_path)
        except OSError as exc:
            print(f"error: cannot write {json_path}: {exc.strerror}", file=sys.stderr)
            return 2
    return report.exit_code

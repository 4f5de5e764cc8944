#!/usr/bin/env python3
"""Set up and run FAST from a fresh clone with nothing but Python 3.11 and pip.

    python3 dev.py train    # the main job: fast train, the whole local stack
    python3 dev.py test     # the test suite, on parallel workers (docs/testing.md)
    python3 dev.py test --quick   # the inner loop: no end-to-end runs (`slow`), no browser

Creates .venv/ on first use and installs the project into it (torch pinned to the CPU
wheel 2.13.0); later runs reuse it and reinstall only when pyproject.toml changed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PYTHON = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
STAMP = VENV / ".fast-installed"


def _run(*cmd: str | os.PathLike) -> None:
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run(list(map(str, cmd)), cwd=ROOT, check=True)


def ensure_venv() -> None:
    if sys.version_info < (3, 11):
        sys.exit(f"FAST needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    if not PYTHON.exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
    # Reinstall when the project file or the set of packages changes (an editable install
    # maps the packages that existed when it was made).
    packages = sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + repr(packages).encode()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == want:
        return
    # torch first and by exact version, so pip takes the CPU wheel and never a CUDA build.
    _run(PYTHON, "-m", "pip", "install", "--disable-pip-version-check", "-q", "torch==2.13.0")
    _run(PYTHON, "-m", "pip", "install", "--disable-pip-version-check", "-q", "-e", ".[dev]")
    STAMP.write_text(want)


BROWSERS = ("chromium", "chromium-browser")


def _can_apt() -> bool:
    """Root on a Debian-like system (CI is): system packages the tests use can be installed."""
    return bool(shutil.which("apt-get")) and hasattr(os, "geteuid") and os.geteuid() == 0


def ensure_browser() -> None:
    """Debian's chromium, for the dashboard's browser test: installed with apt-get when this is root on
    Debian (CI is); elsewhere the test is skipped with a note saying how to get it."""
    if any(shutil.which(name) for name in BROWSERS):
        return
    if _can_apt():
        _run("apt-get", "update", "-qq")
        _run("apt-get", "install", "-y", "-qq", "chromium")
    else:
        print("note: no chromium found; the dashboard's browser test will be skipped (apt-get install chromium)")


NODE_EXAMPLE = ROOT / "examples" / "node_sim"


def ensure_node_example() -> None:
    """The Node example's packages (`npm ci`) for tests/test_examples.py, when node and npm exist and
    node_modules/ is missing or older than package-lock.json; without node the test is skipped."""
    if not (shutil.which("node") and shutil.which("npm")) and _can_apt():
        _run("apt-get", "update", "-qq")
        _run("apt-get", "install", "-y", "-qq", "nodejs", "npm")
    if not (shutil.which("node") and shutil.which("npm")):
        print("note: no node/npm found; the Node simulator example's test will be skipped (apt-get install nodejs npm)")
        return
    modules, lock = NODE_EXAMPLE / "node_modules", NODE_EXAMPLE / "package-lock.json"
    if modules.exists() and modules.stat().st_mtime >= lock.stat().st_mtime:
        return
    print("+ npm ci (examples/node_sim)", flush=True)
    npm = [shutil.which("npm"), "ci", "--no-audit", "--no-fund", "--loglevel=error"]
    if subprocess.run(npm, cwd=NODE_EXAMPLE).returncode != 0:
        print("note: npm ci failed in examples/node_sim; the Node simulator example's test will fail")


# pytest-xdist workers for `dev.py test`. More than the cores pay: most tests wait on sockets,
# processes and timers (measured in docs/testing.md). A user's own `-n` comes later and wins.
TEST_WORKERS = "4"
# `dev.py test --quick`: the `slow` tests (end-to-end runs of several processes, the browser) left out.
QUICK = ["-m", "not slow and not chaos"]

COMMANDS = {
    "train": [["-m", "fast", "train"]],
    # Lint and format first (seconds), then the tests; extra arguments go to pytest.
    "test": [
        ["-m", "ruff", "check", "."],
        ["-m", "ruff", "format", "--check", "."],
        ["-m", "pytest", "-q", "-n", TEST_WORKERS],
    ],
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__)
        return 2
    ensure_venv()
    if argv[0] == "test":
        ensure_browser()
        ensure_node_example()
    steps, user = COMMANDS[argv[0]], argv[1:]
    if argv[0] == "test" and "--quick" in user:
        user = [*QUICK, *(a for a in user if a != "--quick")]  # a user's own -m, later, still wins
    for i, args in enumerate(steps):
        last = i == len(steps) - 1
        command = [str(PYTHON), *args, *(user if last else [])]  # the user's arguments are for the last step
        if last and os.name == "posix":
            # The last step replaces this process: a signal meant for the job (a terminal's Ctrl-C, or a
            # SIGINT or SIGTERM sent to this pid alone by a supervisor) reaches the job itself, once, and
            # its exit code is ours. As a child, a SIGINT to dev.py alone killed dev.py with a traceback
            # and left `fast train` running without its caller.
            os.chdir(ROOT)
            sys.stdout.flush()
            sys.stderr.flush()
            os.execv(command[0], command)
        code = subprocess.run(command, cwd=ROOT).returncode
        if code != 0:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`python -m fast ...` runs the `fast` command (jobs/cli.py), as the installed script does.

This file is a program's entry point, never imported by a module: the one place where the
bottom layer names the top one (docs/architecture.md).
"""

from jobs.cli import app

app()

"""Checkpoint files by name, without torch: where version v is written, and which versions a directory holds.

learner.checkpoint reads and writes them (torch); this part stays importable by a process that only lists
them (`fast train`'s restart, jobs/train/restart.py), which would otherwise load torch for a regex.
"""

from __future__ import annotations

import re
from pathlib import Path

_NAME = re.compile(r"^ckpt-(\d{9,})\.pt$")


def checkpoint_path(directory: Path, version: int) -> Path:
    return Path(directory) / f"ckpt-{version:09d}.pt"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(version, path) of every checkpoint in `directory`, oldest first; [] if it does not exist."""
    directory = Path(directory)
    found = []
    try:
        for path in directory.iterdir():
            match = _NAME.match(path.name)
            if match and path.is_file():  # False for a file pruned since the listing: skipped
                found.append((int(match.group(1)), path))
    except (FileNotFoundError, NotADirectoryError):  # no directory yet, or removed while listed
        return []
    return sorted(found)

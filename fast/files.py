"""Files that readers poll while a process rewrites them."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all: into a hidden sibling first, then renamed over it, so a
    reader (a user's script, the gateway, a test) sees the old file or the new one, never half of one."""
    path = Path(path)
    temp = path.with_name(f".{path.name}.partial")
    temp.write_text(text)
    os.replace(temp, path)

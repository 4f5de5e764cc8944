"""A broker's metrics.jsonl made to agree with the learner's version after a restart: the one rule of
`fast train`'s group restart (jobs/train/restart.py) and of a broker restarted alone by its platform
(Compose, Kubernetes; broker/run.py).

A broker writes the line of policy version v once the update v -> v+1 answered. When the learners
restart from the checkpoint of version V (their updates past it lost with them), the lines of
policy_version >= V record updates that no longer exist: those versions are trained again, from V,
and must be recorded once, then. So the lines of policy_version >= V are dropped (and a partial last
line, a broker killed mid-write), and the broker numbers its iterations on from the lines it keeps:
in a group of ranks, where every version is one iteration, that is iteration = V, the line of version
V being iteration V + 1, as before the restart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fast.files import write_text_atomic

METRICS_FILE = "metrics.jsonl"


def whole_lines(text: str) -> tuple[list[tuple[str, int | None]], bool]:
    """Each whole line of a metrics.jsonl's text with its policy_version (None when unreadable), and
    whether a partial last line follows (a broker killed mid-write: no record)."""
    lines = []
    for line in text.split("\n")[:-1]:  # the part after the last newline is no whole line
        try:
            lines.append((line, int(json.loads(line)["policy_version"])))
        except (ValueError, KeyError, TypeError):
            lines.append((line, None))
    return lines, bool(text) and not text.endswith("\n")


def _read(path: Path) -> str | None:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        return None


def recorded_versions(path: Path) -> list[int]:
    """The policy versions of a metrics.jsonl's whole, readable lines, in file order ([] without a file)."""
    text = _read(path)
    return [version for _, version in whole_lines(text)[0] if version is not None] if text is not None else []


def consecutive_from_zero(versions: list[int]) -> int:
    """How many versions 0, 1, 2, ... the list starts with: the first version it does not record."""
    count = 0
    for version in versions:
        if version != count:
            break
        count += 1
    return count


@dataclass(frozen=True)
class Cut:
    """A metrics.jsonl's text without the lines past a resumed version."""

    text: str  # what the file holds after the cut
    kept: int  # whole lines kept: the iterations learnt from before the resumed version
    dropped: int  # lines taken out: policy_version >= the resumed version, unreadable, or partial
    first_missing: int  # the first version the kept lines do not record consecutively from 0


def cut_lines(text: str, version: int) -> Cut:
    """`text` (a metrics.jsonl's) without the lines of policy_version >= `version`, nor any unreadable or
    partial line."""
    lines, partial = whole_lines(text)
    kept = [(line, v) for line, v in lines if v is not None and v < version]
    return Cut(
        text="".join(f"{line}\n" for line, _ in kept),
        kept=len(kept),
        dropped=len(lines) - len(kept) + partial,
        first_missing=consecutive_from_zero([v for _, v in kept]),
    )


def cut_file(path: Path, version: int) -> Cut | None:
    """Rewrite a metrics.jsonl without the lines of policy_version >= `version` (and any unreadable or
    partial line), whole or not at all; None without a file. Unchanged text is not rewritten."""
    text = _read(path)
    if text is None:
        return None
    cut = cut_lines(text, version)
    if cut.text != text:
        write_text_atomic(Path(path), cut.text)
    return cut


def drop_lines_from(path: Path, version: int) -> int:
    """cut_file's count: how many lines were dropped (0 without a file)."""
    cut = cut_file(path, version)
    return cut.dropped if cut is not None else 0

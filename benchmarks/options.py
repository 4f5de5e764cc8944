"""Command-line value parsers the benchmarks share (argparse `type=` functions): a bad value exits 2
with argparse's message naming the flag, and what to give instead."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

PRESETS = ("off", "calibrated", "parallel", "vectorized")  # the cost presets a benchmark sweeps


def count(text: str, least: int = 1) -> int:
    value = int(text)  # ValueError: argparse names the flag and the value
    if value < least:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: give an integer >= {least}")
    return value


def counts(text: str) -> list[int]:
    """A comma-separated list of counts >= 1, sorted, each once."""
    return sorted({count(x) for x in text.split(",")})


def names(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    """A parser of comma-separated names among `choices`, each once, in the order given."""

    def parse(text: str) -> list[str]:
        given = text.split(",")
        if not set(given) <= set(choices):
            raise argparse.ArgumentTypeError(f"{text[:40]!r}: give some of {','.join(choices)}")
        return list(dict.fromkeys(given))

    return parse


def checkpoint(text: str) -> Path:
    """A folder holding at least one checkpoint (a `fast train` run's checkpoints/)."""
    from learner.checkpoint import list_checkpoints

    path = Path(text)
    if not path.is_dir() or not list_checkpoints(path):
        raise argparse.ArgumentTypeError(f"{text[:80]!r} holds no checkpoint; give a fast train run's checkpoints/")
    return path


def seed(text: str) -> int:
    return count(text, least=0)

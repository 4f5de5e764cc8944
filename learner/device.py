"""Which device the learner runs on: the best one present (CUDA when available, else the CPU)."""

from __future__ import annotations

import torch


def pick_device(requested: str | None = None) -> torch.device:
    """`cuda` when available else `cpu`; an explicit `requested` device is honoured or refused.

    Refusing (ValueError) a requested CUDA device that is absent beats silently training on
    the CPU at a fraction of the speed the operator planned for.
    """
    if requested is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {requested!r} requested but CUDA is not available; use 'cpu' or leave it unset")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {requested!r} requested but only {torch.cuda.device_count()} CUDA device(s) are present"
            )
    elif device.type != "cpu":
        raise ValueError(f"device {requested!r}: expected 'cpu', 'cuda' or 'cuda:<index>'")
    return device

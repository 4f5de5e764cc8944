"""The simulator kit: serve your own engine from Python as `fast sim-server` serves the built-in ones.

    from sim_server import kit

    def make_engine(**kwargs) -> gymnasium.Env:  # one engine per slot, at module level
        ...

    if __name__ == "__main__":
        kit.run(make_engine, slots=4, processes=4, port=50051)

`run` accepts a Gymnasium id (`"CartPole-v1"`, `"my_pkg:MyEnv-v0"`), a factory of one
`gymnasium.Env` (`kind="gym"`, the default) or a factory of a whole `SlotEnv` (`kind="slot"`,
called as `factory(num_slots=..., seed=..., [num_clips=...], **env_kwargs)`), plus any setting
of `SimServerConfig` (slots, processes, port, env_kwargs, cost_preset, ...). It serves until
SIGTERM or SIGINT, then drains and joins the workers. docs/simulator_kit.md.

A factory must be importable by name (defined at module level), because `--processes` workers
build their engines from that name; a script's factory is found in its `__main__` as long as the
script guards its `run` call with `if __name__ == "__main__":`.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable
from typing import Any, Literal

from fast.lifecycle import exit_with_parent
from sim_server.config import SimServerConfig


def env_spec(env: str | Callable[..., Any], kind: Literal["gym", "slot"] = "gym") -> str:
    """The `--env` spec serving `env`: a Gymnasium id or an importable factory of `kind`."""
    if isinstance(env, str):
        return env if env.startswith(("gym:", "slot:")) or env == "takeover" else f"gym:{env}"
    module, name = getattr(env, "__module__", None), getattr(env, "__qualname__", "")
    found = None
    if module and "." not in name and "<" not in name:
        found = getattr(importlib.import_module(module), name, None)
    if found is not env:
        raise ValueError(f"{env!r} cannot be imported by name; define the factory at module level")
    return f"{kind}:{module}:{name}"


def run(env: str | Callable[..., Any], *, kind: Literal["gym", "slot"] = "gym", **settings: Any) -> None:
    """Serve `env` over gRPC until SIGTERM or SIGINT (see the module docstring)."""
    from sim_server.server import serve

    exit_with_parent()  # started by a FAST job: stop with it
    asyncio.run(serve(SimServerConfig(env=env_spec(env, kind), **settings)))

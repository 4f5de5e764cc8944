"""Build the environment a server serves from its `--env` spec.

Specs:
- `takeover`: the built-in driving workload.
- `gym:<id>`: a registered Gymnasium id, one instance per slot; `gym:<module>:<id>` imports the
  module first (Gymnasium's own rule), so a package can register its envs on import.
- `gym:<module>:<callable>`: a factory, called with the `--env-kwarg`s, that returns one
  `gymnasium.Env` per slot (the module must have an attribute of that name that is callable).
- `slot:<module>:<callable>`: a factory of a whole `SlotEnv` (sim_server/env_api.py), called as
  `callable(num_slots=..., num_clips=..., seed=..., **env_kwargs)` (num_clips only when set).

With `processes` > 1 the slots are spread over that many worker processes, each building the
same spec for its share of the slots (sim_server/workers.py).
"""

from __future__ import annotations

import functools
import importlib
import types
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator

from sim_server.env_api import SlotEnv

SPEC_HELP = "use 'takeover', 'gym:<Gymnasium id>', 'gym:<module>:<factory>' or 'slot:<module>:<factory>'"


def check_env_spec(spec: str) -> str:
    """The spec itself when it names an env kind make_env knows; ValueError with the fix otherwise."""
    if spec == "takeover" or (spec.startswith("gym:") and len(spec) > 4):
        return spec
    if spec.startswith("slot:") and _split_module(spec[5:]) is not None:
        return spec
    raise ValueError(SPEC_HELP)


# A config field holding an env spec ("takeover", "gym:..." or "slot:..."), checked as make_env reads it.
EnvSpec = Annotated[str, AfterValidator(check_env_spec)]


def _split_module(target: str) -> tuple[str, str] | None:
    module, sep, name = target.rpartition(":")
    return (module, name) if sep and module and name else None


def _import_attr(module_name: str, name: str) -> Any:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"module {module_name!r} cannot be imported: {exc}") from None
    return getattr(module, name, None)


def gym_factory(target: str, env_kwargs: dict[str, Any] | None = None) -> Callable[[], Any]:
    """A picklable callable making one Gymnasium env of `gym:<target>`: a factory's or gym.make's."""
    kwargs = dict(env_kwargs or {})
    split = _split_module(target)
    if split is not None:
        attr = _import_attr(*split)
        if callable(attr) and not isinstance(attr, types.ModuleType):
            return functools.partial(attr, **kwargs)
    import gymnasium as gym

    return functools.partial(gym.make, target, **kwargs)


def make_env(
    spec: str,
    num_slots: int,
    *,
    seed: int = 0,
    num_clips: int | None = None,
    env_kwargs: dict[str, Any] | None = None,
    processes: int | None = None,
) -> SlotEnv:
    """The SlotEnv of `spec` (see the module docstring); in `processes` worker processes when set."""
    kwargs = dict(env_kwargs or {})
    if processes:
        from sim_server.workers import ProcessSlotEnv

        check_env_spec(spec)
        return ProcessSlotEnv(spec, num_slots, processes=processes, seed=seed, num_clips=num_clips, env_kwargs=kwargs)
    if spec == "takeover":
        from sim_server.takeover import TakeoverEnv

        return TakeoverEnv(num_slots=num_slots, seed=seed, num_clips=num_clips or 200, **kwargs)
    if spec.startswith("gym:") and len(spec) > 4:
        from sim_server.gym_adapter import GymSlotEnv

        return GymSlotEnv(gym_factory(spec[4:], kwargs), num_slots=num_slots, num_clips=num_clips or 1000, name=spec)
    split = _split_module(spec[5:]) if spec.startswith("slot:") else None
    if split is not None:
        factory = _import_attr(*split)
        if not callable(factory):
            raise ValueError(f"env {spec!r}: module {split[0]!r} has no callable {split[1]!r}")
        if num_clips is not None:
            kwargs["num_clips"] = num_clips
        return factory(num_slots=num_slots, seed=seed, **kwargs)
    raise ValueError(f"env {spec!r} is unknown; {SPEC_HELP} (e.g. gym:CartPole-v1)")

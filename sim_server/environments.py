"""Build the environment a server serves from its `--env` spec."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator

from sim_server.env_api import SlotEnv


def check_env_spec(spec: str) -> str:
    """The spec itself when it names an env kind make_env knows; ValueError with the fix otherwise."""
    if spec != "takeover" and not (spec.startswith("gym:") and len(spec) > 4):
        raise ValueError("use 'takeover' or 'gym:<registered Gymnasium id>'")
    return spec


# A config field holding an env spec ("takeover" or "gym:<id>"), checked as make_env reads it.
EnvSpec = Annotated[str, AfterValidator(check_env_spec)]


def make_env(
    spec: str, num_slots: int, *, seed: int = 0, num_clips: int | None = None, env_kwargs: dict[str, Any] | None = None
) -> SlotEnv:
    """`takeover` (the built-in driving workload) or `gym:<id>` (any Gymnasium env)."""
    kwargs = dict(env_kwargs or {})
    if spec == "takeover":
        from sim_server.takeover import TakeoverEnv

        return TakeoverEnv(num_slots=num_slots, seed=seed, num_clips=num_clips or 200, **kwargs)
    if spec.startswith("gym:") and len(spec) > 4:
        from sim_server.gym_adapter import GymSlotEnv

        return GymSlotEnv(spec[4:], num_slots=num_slots, num_clips=num_clips or 1000, **kwargs)
    raise ValueError(
        f"env {spec!r} is unknown; use 'takeover' or 'gym:<registered Gymnasium id>' (e.g. gym:CartPole-v1)"
    )

"""One typed config per process, resolved once from defaults < file < environment < flags.

Every service describes its settings as a pydantic model. `resolve_config` merges a YAML
file, environment variables `<PREFIX><FIELD>` (upper case) and explicit command-line values,
validates once, and raises `ConfigError` with every offending field, its value and the fix.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

Model = TypeVar("Model", bound=BaseModel)


class ConfigError(ValueError):
    """A configuration that does not validate; the message lists every problem."""


def _from_file(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of field: value, got {type(data).__name__}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _from_env(model: type[BaseModel], prefix: str, environ: dict[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in model.model_fields:
        raw = environ.get(f"{prefix}{name.upper()}")
        if raw is not None:
            # YAML parsing turns "8" into 8 and "{a: 1}" into a dict, like the file does.
            values[name] = yaml.safe_load(raw) if raw.strip() else raw
    return values


def resolve_config(
    model: type[Model],
    *,
    file: Path | None = None,
    env_prefix: str = "",
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> Model:
    """Merge the sources (later wins) and validate; flags left unset (None) do not override."""
    merged: dict[str, Any] = {}
    merged.update(_from_file(file))
    merged.update(_from_env(model, env_prefix, dict(os.environ) if environ is None else environ))
    merged.update({k: v for k, v in (overrides or {}).items() if v is not None})
    unknown = sorted(set(merged) - set(model.model_fields))
    if unknown:
        known = ", ".join(model.model_fields)
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)}; known settings: {known}")
    try:
        return model.model_validate(merged)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in err['loc'])}={err.get('input')!r}: {err['msg']}"
            if err["loc"]
            else err["msg"].removeprefix("Value error, ")
            for err in exc.errors()
        ]
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None

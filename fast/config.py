"""One typed config per process, resolved once from defaults < file < environment < flags.

Every service describes its settings as a pydantic model. `resolve_config` merges a YAML
file, environment variables `<PREFIX><FIELD>` (upper case) and explicit command-line values,
validates once, and raises `ConfigError` with every offending field, its value and the fix.

A variable under the prefix that names no field (`FAST_TRAIN_SIMULATRS`) is an error naming it
and the closest setting, never silently dropped. Two kinds are not ours and pass: variables under
a longer prefix of another process (`ENV_PREFIXES`), and the service-link variables Kubernetes
puts in every pod for each Service (`FAST_BROKER_SERVICE_HOST`, `FAST_LEARNER_PORT_50052_TCP`, ...).
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

Model = TypeVar("Model", bound=BaseModel)

# The prefix of every process that reads settings from the environment (each module's ENV_PREFIX;
# tests/test_tensor_and_config.py checks the list). Variables shared by every process
# (FAST_AUTH_TOKEN, FAST_AUTH_TOKEN_FILE, FAST_HOME, FAST_PARENT_PID) fall under none of them.
ENV_PREFIXES = ("FAST_SIM_", "FAST_LEARNER_", "FAST_BROKER_", "FAST_GATEWAY_", "FAST_TRAIN_")
# Kubernetes service links: for a Service "fast-broker", every pod gets FAST_BROKER_SERVICE_HOST,
# FAST_BROKER_SERVICE_PORT[_<NAME>], FAST_BROKER_PORT=tcp://IP:PORT and FAST_BROKER_PORT_<N>_TCP[_PROTO|_PORT|_ADDR].
_SERVICE_LINK = re.compile(
    r"^([A-Z0-9_]+_)?(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_\d+_(TCP|UDP|SCTP)(_[A-Z]+)?)$"
)
_LINK_ADDRESS = re.compile(r"^([A-Z0-9_]+_)?PORT$")
_LINK_VALUE = re.compile(r"^(tcp|udp|sctp)://")


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
    if prefix:
        unknown = unknown_variables(model, prefix, environ)
        if unknown:
            raise ConfigError("; ".join(unknown))
    return values


def unknown_variables(model: type[BaseModel], prefix: str, environ: dict[str, str]) -> list[str]:
    """One message per `<prefix>*` variable of `environ` that names no field of `model`, with the closest
    valid name; variables of a longer prefix (another process's) and Kubernetes service links pass."""
    fields = {name.upper() for name in model.model_fields}
    longer = tuple(other for other in ENV_PREFIXES if other != prefix and other.startswith(prefix))
    problems = []
    for variable in sorted(environ):
        if not variable.startswith(prefix) or (longer and variable.startswith(longer)):
            continue
        rest = variable[len(prefix) :]
        if rest in fields or _service_link(rest, environ[variable]):
            continue
        close = difflib.get_close_matches(rest, sorted(fields), n=1, cutoff=0.6)
        hint = f"did you mean {prefix}{close[0]}?" if close else f"the settings are {', '.join(sorted(fields))}"
        problems.append(
            f"environment variable {variable} names no setting under {prefix}*: {hint} "
            "(rename or unset it; a misspelt variable would otherwise be ignored)"
        )
    return problems


def _service_link(rest: str, value: str) -> bool:
    return bool(_SERVICE_LINK.match(rest) or (_LINK_ADDRESS.match(rest) and _LINK_VALUE.match(value.strip())))


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
        guesses = [
            f"{name} -> {close[0]}"
            for name in unknown
            if (close := difflib.get_close_matches(name, list(model.model_fields), n=1, cutoff=0.6))
        ]
        hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)}{hint}; known settings: {known}")
    try:
        return model.model_validate(merged)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in err['loc'])}={err.get('input')!r}: {err['msg'].removeprefix('Value error, ')}"
            if err["loc"]
            else err["msg"].removeprefix("Value error, ")
            for err in exc.errors()
        ]
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None

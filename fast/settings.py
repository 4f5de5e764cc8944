"""Each setting declared once, in its pydantic model; the command line derives from it and back.

A setting is a field of its process's model (sim_server/config.py, learner/config.py, broker/config.py,
gateway/settings.py, jobs/train/config.py): its type, range (`ge`, `gt`, `le`, `lt`), default and
one-line help (`Field(description=...)`). From that one declaration come

  --kebab-name VALUE  the command-line option (`options`, used by jobs/cli.py). Its help shows the
                      description, the choices of a Literal, the range and the default, all read
                      from the field; an option left out is no setting given (the environment or
                      the file then decide, else the model's default). A bool is --name/--no-name,
                      a list is comma-separated (--simulators a:1,b:2), a dict is a repeated
                      KEY=VALUE option (`Flag` names it);
  <PREFIX><NAME>      the environment variable, and `name:` the key of a --config YAML file
                      (fast/config.py: resolve_config, flags > environment > file > defaults);

and `Settings.to_argv` writes a config back as the command line that gives it, so that a job starts a
service from a config object (jobs/train/orchestrate.py) instead of listing its flags by hand.
`same_as` lets a job's model take a service's setting over whole (type, range, default, help).

Why a helper of our own rather than a library (looked at before writing this one):
- typer has no pydantic-model parameters (fastapi/typer#111, closed; the PRs for it, #803 and
  others, were closed unmerged).
- pydantic-typer builds the options from a model, but calls itself early development, and
  validates the model from the flags alone: typer then fills in every default, so a flag left out
  cannot be told from one given at its default, and resolve_config's order (an unset flag leaves
  the environment's or the file's value) would be lost.
- pydantic-settings' CLI (CliApp, CliSettingsSource) parses with argparse: it would replace typer
  under these commands (their help, `fast`'s subcommands), and its environment source reads JSON
  rather than YAML values and has no check of misspelt variables (fast/config.py has).
Both would also be a new dependency, for some 300 lines here on typer's public API (a typer.Option in
`Annotated`, a function's `__signature__`, typer.Context's parameter source). typer is imported only
when options are built, so a service that imports its config (and this module) does not load it.
"""

from __future__ import annotations

import functools
import inspect
import json
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import annotated_types
import yaml
from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Flag:
    """A field's option where it is not --kebab-name: `Annotated[dict[str, Any], Flag("--env-kwarg")]`."""

    name: str


# -- the fields ------------------------------------------------------------------------------------


def _unwrap_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _kind(field: FieldInfo) -> tuple[str, Any]:
    """("bool" | "list" | "dict" | "path" | "int" | "float" | "str", Literal choices or None)."""
    annotation = _unwrap_optional(field.annotation)
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "str", typing.get_args(annotation)
    if origin in (list, tuple, set, frozenset):
        return "list", None
    if origin is dict or annotation is dict:
        return "dict", None
    if annotation is bool:
        return "bool", None
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "path", None
    if annotation in (int, float):
        return annotation.__name__, None
    return "str", None


def flag_name(name: str, field: FieldInfo) -> str:
    """The option of a field: --kebab-name, or its `Flag`."""
    for item in field.metadata:
        if isinstance(item, Flag):
            return item.name
    return "--" + name.replace("_", "-")


def default_of(field: FieldInfo) -> Any:
    if field.default_factory is not None:
        return field.default_factory()
    return None if field.default is PydanticUndefined else field.default


def _scalar_text(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)  # repr: the float itself, read back


def cli_default(field: FieldInfo) -> Any:
    """The field's default as its option holds it, which `--help` shows: a list comma-joined, a dict none."""
    kind, _ = _kind(field)
    value = default_of(field)
    if kind == "list":
        return ",".join(_scalar_text(v) for v in value) if value else None
    if kind == "dict":
        return None
    return value


def _dict_value_text(value: Any) -> str:
    if isinstance(value, str) and yaml.safe_load(value) == value:
        return value
    return json.dumps(value)  # JSON is YAML: a value read back by yaml.safe_load is the same


def parse_cli_value(name: str, field: FieldInfo, raw: Any) -> Any:
    """What an option gave, as the value handed to the model (None: not given)."""
    if raw is None:
        return None
    kind, _ = _kind(field)
    if kind == "list":
        return [part.strip() for part in str(raw).split(",") if part.strip()]
    if kind == "dict":
        if not raw:
            return None
        out: dict[str, Any] = {}
        for pair in raw:
            key, sep, value = pair.partition("=")
            if not sep or not key:
                import typer

                raise typer.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint=flag_name(name, field))
            out[key] = yaml.safe_load(value)
        return out
    return raw


def _bound(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def range_text(field: FieldInfo) -> str:
    """The field's bounds as click writes a range ("x>=1", "0<x<=1"); "" when it has none."""
    low = high = ""
    for item in field.metadata:
        if isinstance(item, annotated_types.Ge):
            low = f"{_bound(item.ge)}<="
        elif isinstance(item, annotated_types.Gt):
            low = f"{_bound(item.gt)}<"
        elif isinstance(item, annotated_types.Le):
            high = f"<={_bound(item.le)}"
        elif isinstance(item, annotated_types.Lt):
            high = f"<{_bound(item.lt)}"
    if low and not high:  # "x>=1" reads better than "1<=x"
        return f"x>={low[:-2]}" if low.endswith("<=") else f"x>{low[:-1]}"
    return f"{low}x{high}" if low or high else ""


def help_text(field: FieldInfo) -> str:
    """The description, then the Literal's choices and the range, for `--help`."""
    from rich.markup import escape  # typer renders help as rich markup

    text = (field.description or "").strip()
    _, choices = _kind(field)
    if choices:  # a Literal: its values, in the order written
        text = f"{text} {' | '.join(map(str, choices))}.".strip()
    text = escape(text)
    bounds = range_text(field)
    return f"{text} \\[{bounds}]" if bounds else text


# -- a model's settings on the command line --------------------------------------------------------


def _option_parameter(name: str, field: FieldInfo) -> inspect.Parameter:
    import typer

    kind, _ = _kind(field)
    flag = flag_name(name, field)
    text = help_text(field)
    if kind == "bool":
        option = typer.Option(f"{flag}/--no-{flag.removeprefix('--')}", help=text)
        annotation: Any = typing.Optional[bool]
    elif kind == "dict":
        option = typer.Option(flag, metavar="KEY=VALUE", help=f"{text} (repeatable)")
        annotation = typing.Optional[list[str]]
    elif kind == "list":
        option = typer.Option(flag, metavar="A,B,...", help=text)
        annotation = typing.Optional[str]
    else:
        option = typer.Option(flag, help=text)
        scalar = {"int": int, "float": float, "path": Path, "str": str}[kind]
        annotation = typing.Optional[scalar]
    # The option's default is the model's, so that --help shows it; a value typer filled in from it is
    # not handed on (`options`), so the environment or the file still decide an option left out.
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        annotation=typing.Annotated[annotation, option],
        default=cli_default(field),
    )


# The parameter typer hands the command's context in (to tell a flag given from its default).
_CONTEXT = "_typer_context"


def given(context: Any, name: str) -> bool:
    """Whether the option of parameter `name` was given on the command line (`context`: a typer.Context),
    rather than filled in by typer from its default."""
    source = context.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def _own_fields_first(model: type[BaseModel]) -> list[str]:
    """The model's fields, its own first and a base class's (the TLS settings) after them."""
    order: list[str] = []
    for cls in model.__mro__:
        for name in cls.__dict__.get("__annotations__", {}):
            if name in model.model_fields and name not in order:
                order.append(name)
    return order + [name for name in model.model_fields if name not in order]


def options(model: type[BaseModel]) -> Callable[[F], F]:
    """A typer command taking one option per field of `model`.

    The decorated function takes `settings`: the options given, field name -> value ready for
    resolve_config (an option left out is not there, so the environment or the file decides);
    its own other parameters (`--config`) stay as they are. The options come first: the model's own
    fields in their order, then those of its base classes (the TLS settings).
    """
    fields = {name: model.model_fields[name] for name in _own_fields_first(model)}

    def decorate(func: F) -> F:
        own = inspect.signature(func, eval_str=True)
        params = [_option_parameter(name, field) for name, field in fields.items()]
        rest = [p.replace(kind=p.KEYWORD_ONLY) for p in own.parameters.values() if p.name != "settings"]

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            context = kwargs.pop(_CONTEXT)
            settings = {}
            for name, field in fields.items():
                raw = kwargs.pop(name, None)
                if not given(context, name):
                    continue  # typer's copy of the model's default: not a flag given
                value = parse_cli_value(name, field, raw)
                if value is not None:
                    settings[name] = value
            return func(settings=settings, **kwargs)

        import typer

        context = inspect.Parameter(_CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
        command.__signature__ = own.replace(parameters=[*params, *rest, context])  # type: ignore[attr-defined]
        return command  # type: ignore[return-value]

    return decorate


# -- a config back to the command line -------------------------------------------------------------


def to_argv(cfg: BaseModel, *, fields: typing.Iterable[str] | None = None) -> list[str]:
    """The options that give `cfg`'s settings: those set when it was made (`fields`: these instead).

    Parsing them (with no environment or file) gives back an equal config; a setting left at None
    has no option and is left out.
    """
    names = set(cfg.model_fields_set if fields is None else fields)
    argv: list[str] = []
    for name, field in type(cfg).model_fields.items():
        if name not in names:
            continue
        value = getattr(cfg, name)
        if value is None:
            continue
        kind, _ = _kind(field)
        flag = flag_name(name, field)
        if kind == "bool":
            argv.append(flag if value else f"--no-{flag.removeprefix('--')}")
        elif kind == "dict":
            for key, item in value.items():
                argv += [flag, f"{key}={_dict_value_text(item)}"]
        elif kind == "list":
            argv += [flag, ",".join(_scalar_text(v) for v in value)]
        else:
            argv += [flag, _scalar_text(value)]
    return argv


def same_as(model: type[BaseModel], name: str, **changes: Any) -> Any:
    """A copy of `model`'s field `name` (type bounds, default, description), for another model's field of
    the same setting: `alpha: float = same_as(BrokerConfig, "alpha")`. `changes`: default=, description=."""
    field = model.model_fields[name]
    kwargs: dict[str, Any] = {"description": field.description}
    if field.default_factory is not None:
        kwargs["default_factory"] = field.default_factory
    else:
        kwargs["default"] = field.default
    kwargs.update(changes)
    if "default" in changes:
        kwargs.pop("default_factory", None)
    copy = Field(**kwargs)
    copy.metadata = [*field.metadata, *copy.metadata]
    return copy


class Settings(BaseModel):
    """The base of every process's config: `to_argv` (the options that give it back)."""

    def to_argv(self, *, fields: typing.Iterable[str] | None = None) -> list[str]:
        return to_argv(self, fields=fields)

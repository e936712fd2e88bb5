"""Typed configuration: dataclasses built from YAML/dicts, with dotted overrides.

``from_dict(TrainConfig, yaml_dict, overrides=["model.d_model=256", "train.tokens=2e6"])``
returns a validated, frozen dataclass tree. Errors are one line naming the dotted
field and the value (``ValueError``), in the style of Levanter/MaxText configs.

Validation has one style. Each subsystem's config is a frozen dataclass deriving from
`Section`, with its dotted name in ``SECTION``; a field's range is declared where the field is
(``lr: float = setting(3e-3, POSITIVE)``) and checked on construction, by the dataclass's own
``__post_init__``; checks across fields go in the section's ``check()``. The run config only
composes the sections and checks what spans them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import reprlib
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

import yaml

from jaxformer.files import load_reason

_SHOWN = reprlib.Repr()  # Python 3.11's takes no arguments
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxstring, _SHOWN.maxother = 2, 4, 4, 60, 60


def shown(value: Any) -> str:
    """``repr(value)`` cut short (a few elements, a few levels): a message names a bad value in one short line,
    whatever its size (a YAML list of a million numbers, aliases nested ten deep)."""
    return _SHOWN.repr(value)


T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a number field may take; ``check`` raises one line naming the field."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False  # "a positive integer": also refuses floats and bools passed from Python

    def check(self, field: str, value: Any) -> None:
        if value is None:  # optional settings are unset
            return
        if self.integer and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"{field} must be a positive integer, got {shown(value)}")
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        if not (too_low or too_high):
            return
        if self.integer and too_low:
            raise ValueError(f"{field} must be a positive integer, got {shown(value)}")
        if self.high is None:
            raise ValueError(f"{field} must be {'positive' if self.low_open else f'>= {self.low}'}, got {shown(value)}")
        if self.integer:
            raise ValueError(f"{field} must be at most {self.high:,}, got {shown(value)}")
        brackets = ("(" if self.low_open else "[") + f"{self.low}, {self.high}" + (")" if self.high_open else "]")
        raise ValueError(f"{field} must be in {brackets}, got {shown(value)}")


MAX_SIZE = 2**31 - 1  # token ids, positions and every array axis are indexed with int32
SIZE = Range(low=0, low_open=True, high=MAX_SIZE, integer=True)  # a count: layers, heads, widths, lengths
POSITIVE = Range(low=0, low_open=True)
NON_NEGATIVE = Range(low=0)
FRACTION = Range(0.0, 1.0)  # [0, 1]
MAX_NESTING = 100  # levels of lists and mappings a YAML file or override may nest (a config nests 3)


def setting(default: Any = dataclasses.MISSING, allowed: Range | None = None, *, factory: Any = dataclasses.MISSING):
    """A config field with a default (or ``factory``) and the `Range` its values must lie in."""
    return dataclasses.field(default=default, default_factory=factory, metadata={"range": allowed})


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    """``cls``'s resolved annotations, once per class: the sweep planner builds thousands of configs."""
    return get_type_hints(cls)


@functools.lru_cache(maxsize=None)
def _field_checks(cls: type) -> tuple[tuple[str, tuple | None, Range | None], ...]:
    """Per field of ``cls``: its name, the choices of a ``Literal`` annotation (else None) and its `Range`
    (else None)."""
    hints = _hints(cls)
    return tuple((field.name, get_args(hints[field.name]) if get_origin(hints[field.name]) is Literal else None,
                  field.metadata.get("range")) for field in dataclasses.fields(cls))


class Section:
    """Base of every config dataclass: ranges checked on construction, errors naming ``SECTION.field``."""

    SECTION: typing.ClassVar[str] = ""

    def __post_init__(self) -> None:
        for field, choices, allowed in _field_checks(type(self)):
            value = getattr(self, field)
            if choices is not None and value not in choices:
                raise ValueError(f"{self.name_of(field)} must be one of {', '.join(map(str, choices))}, "
                                 f"got {shown(value)}")
            if allowed is not None:
                allowed.check(self.name_of(field), value)
        self.check()

    def check(self) -> None:
        """Checks across this section's fields (none by default)."""

    @classmethod
    def name_of(cls, field: str) -> str:
        """The dotted name users write: ``optimizer.lr``."""
        return f"{cls.SECTION}.{field}" if cls.SECTION else field


def _parse_number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _coerce(value: Any, annotation: Any, field: str) -> Any:
    """Converts ``value`` to ``annotation`` or raises ``ValueError`` naming ``field``."""
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = get_args(annotation)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, field)
            except ValueError as error:
                errors.append(str(error))
        raise ValueError(errors[0] if errors else f"{field}: cannot be {shown(value)}")
    if origin is Literal:
        choices = get_args(annotation)
        if value not in choices:
            raise ValueError(f"{field} must be one of {', '.join(map(repr, choices))}, got {shown(value)}")
        return value
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{field} must be a list, got {shown(value)}")
        (item_type, *_) = get_args(annotation) or (Any,)
        items = [_coerce(v, item_type, f"{field}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{field} must be a mapping, got {shown(value)}")
        return dict(value)
    if dataclasses.is_dataclass(annotation):
        if isinstance(value, annotation):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"{field} must be a mapping of {annotation.__name__} fields, got {shown(value)}")
        return from_dict(annotation, value, prefix=field)
    if annotation is Any:
        return value
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError(f"{field} must be true or false, got {shown(value)}")
    if annotation in (int, float):
        number = _parse_number(value) if isinstance(value, str) else value
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise ValueError(f"{field} must be {'an integer' if annotation is int else 'a number'}, got {shown(value)}")
        if not math.isfinite(number):  # inf and NaN are never a size, a budget or a rate
            raise ValueError(f"{field} must be a finite number, got {shown(value)}")
        if annotation is int and (number != int(number) or abs(number) >= 2**63):
            raise ValueError(f"{field} must be an integer (64-bit), got {shown(value)}")
        return annotation(number)
    if annotation is str:
        if not isinstance(value, str):
            raise ValueError(f"{field} must be a string, got {shown(value)}")
        return value
    raise TypeError(f"unsupported config annotation {annotation!r} for {field}")


def from_dict(cls: type[T], data: dict[str, Any] | None, *, prefix: str = "") -> T:
    """Builds dataclass ``cls`` from ``data``; unknown keys, missing required keys and wrong types raise
    ``ValueError``."""
    data = dict(data or {})
    hints = _hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    names = {f.name for f in fields}
    unknown = sorted(set(data) - names, key=str)  # YAML keys may be numbers too: 1: 2
    where = f"{prefix}." if prefix else ""
    if unknown:
        raise ValueError(f"unknown config key '{where}{unknown[0]}' (known: {', '.join(sorted(names))})")
    required = [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [name for name in required if name not in data]
    if missing:
        raise ValueError(f"missing config key '{where}{missing[0]}' (required: {', '.join(required)})")
    kwargs = {key: _coerce(value, hints[key], f"{prefix}.{key}" if prefix else key) for key, value in data.items()}
    return cls(**kwargs)


def to_dict(config: Any) -> dict[str, Any]:
    """The plain-dict (YAML-ready) form of a config dataclass tree."""
    return dataclasses.asdict(config)


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Sets ``data["a"]["b"] = value`` for ``key = "a.b"``, creating sections as needed."""
    node = data
    *parents, leaf = key.split(".")
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ValueError(f"override {key!r}: '{part}' is not a section")
        node = child
    node[leaf] = value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Returns a copy of ``data`` with each ``dotted.key=value`` applied (value parsed as YAML)."""
    result = yaml.safe_load(yaml.safe_dump(data)) or {}
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep or not key:
            raise ValueError(f"override must look like key.sub=value, got {override!r}")
        try:
            value = _yaml_value(text) if text else ""
        except (yaml.YAMLError, ValueError, RecursionError) as error:
            raise ValueError(f"override {key}={shown(text)}: invalid YAML value ({_yaml_reason(error)})") from None
        set_dotted(result, key, value)
    return result


def _yaml_value(text: str) -> Any:
    """``yaml.safe_load(text)``, refused (``ValueError``) past `MAX_NESTING` levels of lists and mappings: what is
    loaded is copied, dumped and shown by code that recurses once or more per level (aliases to an enclosing node
    nest without end)."""
    value = yaml.safe_load(text)
    deepest: dict[int, int] = {}  # id of a list or mapping -> the deepest level it was reached at: aliases share one
    stack = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if not isinstance(node, (list, dict)) or deepest.get(id(node), 0) >= level:
            continue
        if level > MAX_NESTING:
            raise ValueError(f"lists and mappings nested deeper than {MAX_NESTING} levels")
        deepest[id(node)] = level
        stack.extend((child, level + 1) for child in (node.values() if isinstance(node, dict) else node))
    return value


def _yaml_reason(error: Exception) -> str:
    """What a YAML load refused, in one line: the parser's first line, else `jaxformer.files.load_reason`."""
    return str(error).splitlines()[0] if isinstance(error, yaml.YAMLError) else load_reason(error)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Reads a YAML mapping; a missing file or a non-mapping raises one clear error."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a YAML config file")
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    try:
        data = _yaml_value(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file (not UTF-8), so not a YAML config") from None
    except (yaml.YAMLError, ValueError, RecursionError) as error:
        raise ValueError(f"{path}: invalid YAML ({_yaml_reason(error)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data

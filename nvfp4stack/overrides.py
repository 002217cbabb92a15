"""Command-line overrides checked against the schema before Hydra sees them.

Syntax, keys (list items' keys included) and value types: each mistake is one line naming the key,
the value, what was expected and, where a name is close, "did you mean". Hydra would otherwise print
7-8 lines and exit 1, or suggest ``+key=...`` for a typo inside a list item.
"""
from __future__ import annotations

import dataclasses
import typing

from nvfp4stack.usage import CONF_DIR, UsageError, did_you_mean

_SKIPPED_PREFIXES = ("+", "~", "hydra.", "hydra/")


def fields_of(cls: type) -> dict[str, object]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def dataclass_of(tp: object) -> type | None:
    """The dataclass in a field type (``PrecisionRule`` for ``list[PrecisionRule]``), else None."""
    if dataclasses.is_dataclass(tp):
        return tp  # type: ignore[return-value]
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def expected_words(tp: object) -> str:
    """A field type as a person reads it: 'an integer', 'a list [a string, ...]', 'a string or null'."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union or type(tp).__name__ == "UnionType":
        words = [expected_words(a) for a in args if a is not type(None)]
        return " or ".join(words) + (" or null" if type(None) in args else "")
    if origin in (list, tuple) or tp in (list, tuple):
        return f"a list [{expected_words(args[0]) if args else 'a value'}, ...]"
    if origin is dict or tp is dict:
        return "a mapping {key: value}"
    if dataclasses.is_dataclass(tp):
        return "a mapping {" + ", ".join(f.name for f in dataclasses.fields(tp)) + "}"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def _default(cls: type, name: str) -> object:
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)  # MISSING when a factory makes it


def field_path(key: str) -> tuple[type, str, object] | None:
    """(owning dataclass, field name, field type) of a dotted key, None when the key goes on inside a
    plain dict (engine.env.X); raises UsageError for a key the schema lacks."""
    from nvfp4stack.config import RootConfig

    parts = key.split(".")
    cls: type | None = RootConfig
    for depth, part in enumerate(parts):
        fields = fields_of(cls)
        if part not in fields:
            where = ".".join(parts[:depth]) or "the root config"
            raise UsageError(f"unknown config key {key!r}: {where} has no {part!r}; valid keys there: "
                             f"{', '.join(sorted(fields))}{did_you_mean(part, fields, where + '.' if depth else '')}")
        if depth == len(parts) - 1:
            return cls, part, fields[part]
        cls = dataclass_of(fields[part])
        if cls is None:
            return None
    return None


def check_overrides(overrides: list[str]) -> None:
    """Reject a bad override up front: syntax, an unknown key (listing the valid keys at that level),
    an unknown group option, or a value of the wrong type (list items' keys included)."""
    from nvfp4stack.config import GROUPS

    for ov in overrides:
        parsed = _parse(ov)
        if ov.startswith(("-", *_SKIPPED_PREFIXES)) or "=" not in ov:
            continue
        key, raw = ov.split("=", 1)
        if key in ("recipe", "recipes@_global_") or "@" in key:
            continue
        if key in GROUPS:
            check_group_option(key, raw)  # e.g. arch=sm90
            continue
        found = field_path(key)
        if found is None or parsed is None:
            continue
        if parsed.is_discrete_sweep():
            values = list(parsed.sweep_iterator())
        elif parsed.is_sweep_override():
            continue  # range()/interval(): numbers Hydra checks per job
        else:
            values = [parsed.value()]
        for value in values:
            _check_value(key, raw, found, value)


def _parse(ov: str):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    if ov.startswith("-"):
        return None
    try:
        return OverridesParser.create().parse_override(ov)
    except HydraException as e:
        key = ov.split("=", 1)[0]
        brackets = _bracket_problem(ov.split("=", 1)[1] if "=" in ov else ov)
        fix = ("close every [ and {" if brackets else
               "quote a value holding spaces or , : [ ] { } ( ) (key='a b')")
        raise UsageError(f"{key}: the override {ov!r} is not valid override syntax "
                         f"({brackets or str(e).strip().splitlines()[0]}). Fix: {fix}; grammar: "
                         "https://hydra.cc/docs/advanced/override_grammar/basic/") from None


def _bracket_problem(text: str) -> str:
    """'a [ is not closed' / 'a ] closes nothing' for unbalanced brackets outside quotes, else ''."""
    pairs, stack, quote = {"]": "[", "}": "{"}, [], None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            stack.append(ch)
        elif ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                return f"a {ch} closes nothing"
    if quote:
        return f"a {quote} quote is not closed"
    return f"a {stack[-1]} is not closed" if stack else ""


def _check_value(key: str, raw: str, found: tuple[type, str, object], value: object) -> None:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from nvfp4stack.config import RootConfig

    if isinstance(value, str) and "${" in value:
        return  # an interpolation: resolved (and checked) when the config is composed
    cls, name, tp = found
    item_cls = dataclass_of(tp) if typing.get_origin(tp) is list else None
    if item_cls is not None and isinstance(value, list):
        for i, item in enumerate(value):
            _check_item(f"{key}[{i}]", item, item_cls)
        return
    if dataclasses.is_dataclass(tp) and isinstance(value, dict):
        _check_item(key, value, tp)
        return
    try:
        OmegaConf.update(OmegaConf.structured(RootConfig), key, value, merge=True)
    except OmegaConfBaseException:
        default = _default(cls, name)
        fix = f"{key}=<{expected_words(tp).removeprefix('a ').removeprefix('an ')}>" + (
            f" (default: {_as_typed(default)})" if default is not dataclasses.MISSING else "")
        raise UsageError(f"{key}={raw}: expected {expected_words(tp)}, found {value!r}. Fix: {fix}") from None


def _as_typed(value: object) -> str:
    """A value as it is typed on the command line (true, null), not as Python prints it."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _check_item(where: str, item: object, cls: type) -> None:
    """One list item (a precision rule) against its dataclass: keys, then each value's type."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    fields = fields_of(cls)
    if not isinstance(item, dict):
        raise UsageError(f"{where}: expected {expected_words(cls)}, found {item!r}")
    for k, v in item.items():
        if k not in fields:
            raise UsageError(f"{where}: unknown key {k!r}; valid keys: {', '.join(sorted(fields))}"
                             f"{did_you_mean(str(k), fields)}")
        try:
            OmegaConf.merge(OmegaConf.structured(cls), {k: v})
        except OmegaConfBaseException:
            raise UsageError(f"{where}.{k}: expected {expected_words(fields[k])}, found {v!r}") from None


def _first_line(e: BaseException) -> str:
    msg = getattr(e, "msg", None) or str(e)
    return str(msg).strip().splitlines()[0] if str(msg).strip() else type(e).__name__


def describe_config_error(e: BaseException) -> str:
    """One line for an error Hydra or OmegaConf raised while composing the config (what the checks
    above cannot see: a recipe's own values, interpolations, a key added to a plain mapping)."""
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

    lines = str(e).strip().splitlines()
    head = lines[0].rstrip(".") if lines else type(e).__name__
    cause = e if isinstance(e, OmegaConfBaseException) else e.__cause__
    if isinstance(cause, OmegaConfBaseException):
        obj, key = cause.object_type, cause.key
        fields = fields_of(obj) if dataclasses.is_dataclass(obj) else {}
        reason = _first_line(cause)
        if isinstance(cause, ConfigKeyError) and fields and key is not None:
            reason = (f"unknown key {key!r} in {obj.__name__}; valid keys: {', '.join(sorted(fields))}"
                      f"{did_you_mean(str(key), fields)}")
        elif isinstance(cause, ValidationError) and key in fields:
            reason += f"; expected {expected_words(fields[key])}"
        text = f"{cause.full_key or 'the config'}: {reason}"
        if cause is not e:
            text = f"{head}: {text}"
    else:
        text = head
    # Hydra's own advice, kept where it is right: a new key in a plain mapping (engine.env) needs '+'.
    add = next((ln.split(" use ", 1)[1] for ln in lines if ln.startswith("To append to your config use ")), None)
    return text + (f". Fix: to add a new key, write {add}" if add else "")


def check_group_option(group: str, value: str) -> None:
    """``arch=sm100`` -> one line naming the valid options (and the closest), not Hydra's dump."""
    valid = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
    for name in value.split(","):  # a multirun sweep lists several
        if valid and name not in valid:
            raise UsageError(f"{group}={name!r} is not an option of config group {group!r}; valid: "
                             f"{', '.join(valid)}{did_you_mean(name, valid, f'{group}=')}")

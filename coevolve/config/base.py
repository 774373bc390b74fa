"""What every section shares: strict fields, and merging and explaining the values given for them."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

# The most characters of a given value an error quotes.
MAX_SHOWN_CHARS = 300


class Section(BaseModel):
    # A typo in a field name must fail loudly instead of silently using a default. No setting means anything at
    # infinity or NaN: an infinite learning rate passed every lower bound and trained every weight to inf, so
    # `inf`, `-inf` and `nan` are refused in every float field.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
    # Field names earlier versions used -> what replaced them: a configuration that still spells one
    # is refused with that message, never read as if it meant the new setting.
    RENAMED: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _refuse_renamed(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for old, instead in cls.RENAMED.items():
                if old in data:
                    raise ValueError(f"{old!r} is no longer a setting: {instead}")
        return data


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` laid over it, section by section; values in ``extra`` win."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def explain(exc: ValidationError) -> str:
    """The ConfigError message for invalid values: each field with what is wrong and the value given.

    One invalid field is one line, as every error is, the errors of its items (a list's) included; several fields
    are listed one a line.
    """
    fields: dict[tuple[str | int, ...], list[str]] = {}
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if not where.isprintable() or where != where.strip():  # a name holding a line break or tab, shown escaped
            where = repr(where)
        if err["type"] == "extra_forbidden":
            problem = f"{where}: unknown field; check its spelling against `coevolve config --show`"
        else:
            given = repr(err.get("input"))  # whole up to a long path's length; a megabyte of YAML is not echoed
            given = given if len(given) <= MAX_SHOWN_CHARS else f"{given[: MAX_SHOWN_CHARS - 1]}…"
            message = " ".join(str(err["msg"]).split())
            problem = f"{where}: {message} (got {given})"
        fields.setdefault(_field_of(err["loc"]), []).append(problem)
    problems = ["; ".join(items) + "." for items in fields.values()]
    if len(problems) == 1:
        return f"The configuration is invalid: {problems[0]}"
    return "\n".join(["The configuration is invalid:", *(f"  - {problem}" for problem in problems)])


def _field_of(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """The field an error is about: its location up to the first item index (`rollout.gates` of `rollout.gates.1`)."""
    index = next((i for i, part in enumerate(loc) if isinstance(part, int)), len(loc))
    return loc[:index]

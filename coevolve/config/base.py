"""What every section shares: strict fields, and merging and explaining the values given for them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


class Section(BaseModel):
    # A typo in a field name must fail loudly instead of silently using a default.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


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
    """The ConfigError message for invalid values: each field with what is wrong and the value given."""
    lines = ["The configuration is invalid:"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            lines.append(f"  - {where}: unknown field; check its spelling against `coevolve config --show`.")
        else:
            lines.append(f"  - {where}: {err['msg']} (got {err.get('input')!r}).")
    return "\n".join(lines)

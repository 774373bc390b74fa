"""Loading a configuration: defaults < YAML file < ``COEVOLVE_*`` environment < ``--set`` overrides."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource, InitSettingsSource, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError
from pydantic_settings.sources.utils import parse_env_vars

from coevolve.config.base import deep_merge, explain
from coevolve.config.pipeline import PipelineConfig
from coevolve.errors import ConfigError


class _Yaml12Loader(yaml.SafeLoader):
    """YAML with the 1.2 booleans only: ``mode: off`` must stay the string 'off', not become False."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Yaml12Loader)  # noqa: S506 - a SafeLoader subclass


def _nested(dotted: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    node = out
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """Turn ``["rollout.group_size=8", ...]`` into a nested dict; values are parsed as YAML scalars."""
    merged: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(
                f"Override {pair!r} has no '='; write it as section.field=value, e.g. rollout.group_size=8."
            )
        key, raw = pair.split("=", 1)
        try:
            value = _load_yaml(raw) if raw != "" else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"Override {pair!r}: the value is not valid YAML ({exc}).") from exc
        merged = deep_merge(merged, _nested(key.strip(), value))
    return merged


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    environ: Mapping[str, str] | None = None,
    data: dict[str, Any] | None = None,
) -> PipelineConfig:
    """Build the configuration from ``data``, a YAML file, the environment and CLI overrides, later ones winning.

    ``environ`` defaults to the process environment. Raises ConfigError, with what to change, for a
    missing or malformed file and for any invalid value.
    """
    merged: dict[str, Any] = dict(data or {})
    if path is not None:
        merged = deep_merge(merged, _read_file(Path(path)))
    environ = dict(os.environ if environ is None else environ)
    _check_env_names(environ)
    sources = (
        InitSettingsSource(_LayeredConfig, init_kwargs=parse_overrides(overrides or [])),
        _MappingEnvSource(_LayeredConfig, environ),
        InitSettingsSource(_LayeredConfig, init_kwargs=merged),
    )
    try:
        layered = _LayeredConfig(_build_sources=(sources, {}))
        return PipelineConfig.model_validate(layered.model_dump())
    except ValidationError as exc:
        raise ConfigError(explain(exc)) from None
    except SettingsError as exc:
        raise ConfigError(
            f"A COEVOLVE_ environment variable could not be parsed ({exc}); list values are JSON, "
            'e.g. \'["boundary", "rare"]\'.'
        ) from None


def _read_file(file: Path) -> dict[str, Any]:
    if not file.is_file():
        raise ConfigError(f"Config file {file} does not exist; pass an existing YAML file to --config.")
    try:
        loaded = _load_yaml(file.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"Config file {file} is not valid YAML: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"Config file {file} must hold a mapping of sections, not {type(loaded).__name__}.")
    return loaded


class _LayeredConfig(BaseSettings, PipelineConfig):
    """PipelineConfig as pydantic-settings layers it: ``COEVOLVE_<SECTION>__<FIELD>`` variables.

    Used only inside `load_config`; everything else passes the plain PipelineConfig it returns, so a
    configuration handed to a flow, a worker or `with_overrides` never reads the environment again.
    """

    model_config = SettingsConfigDict(
        env_prefix="COEVOLVE_",
        env_nested_delimiter="__",
        case_sensitive=False,
        extra="forbid",
        validate_assignment=True,
    )


class _MappingEnvSource(EnvSettingsSource):
    """The environment source reading a given mapping, so tests and callers can pass their own."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._environ, False, False, None)


def _check_env_names(environ: Mapping[str, str]) -> None:
    """A ``COEVOLVE_<SECTION>__...`` variable naming no section fails loudly instead of being ignored.

    Other COEVOLVE_ variables without a section separator, such as the API keys named by
    rollout.api_key_env, are not configuration and are left alone (a secret is never stored with it).
    """
    sections = set(PipelineConfig.model_fields)
    for name in environ:
        if name.upper().startswith("COEVOLVE_") and "__" in name:
            section = name[len("COEVOLVE_") :].split("__", 1)[0].lower()
            if section not in sections:
                raise ConfigError(
                    f"Environment variable {name}: {section!r} is not a configuration section; "
                    f"use one of {', '.join(sorted(sections))} (check its spelling against `coevolve config --show`)."
                )

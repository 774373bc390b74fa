"""What the agent plays: the environment, its episode limits, and the settings the environment itself declares.

The section's own fields are the ones every environment reads. An environment's own settings (BFCL's prompt style
and handler family) are declared by the environment, as a signal kind declares its thresholds: an
`EnvironmentSettings` model whose fields become fields of this section where environment.name names that
environment, validated when the configuration loads. The configuration finds the model by name without importing
the environment (`settings_model`).
"""

from __future__ import annotations

from importlib.metadata import EntryPoint
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from coevolve.config.base import Section
from coevolve.config.policy import PolicyConfig
from coevolve.plugins import declared_names, declared_points, load_declared

# The environments envs/registry.py builds in (tests/envs/test_environment_registry.py checks the two lists agree),
# and the entry-point group under which an installed package declares another; its names are read here without
# importing the package, so the configuration stays light.
BUILT_IN_ENVIRONMENTS: tuple[str, ...] = ("bfcl", "workplace")
ENVIRONMENT_ENTRY_POINTS = "coevolve.environments"
# The group under which a package declares its environment's settings model, named as the environment; an
# environment that declares none has no settings of its own.
SETTINGS_ENTRY_POINTS = "coevolve.environment_settings"
# The built-in environments' declarations of the same kind (their package is this project, whose metadata names no
# entry points): the model is imported when a configuration names the environment, the environment itself is not.
BUILT_IN_SETTINGS: dict[str, str] = {
    "bfcl": "envs.bfcl.settings:BfclSettings",
    "workplace": "envs.workplace.settings:WorkplaceSettings",
}


def environment_names() -> list[str]:
    """Every value environment.name may take here: the built-in environments, then those installed packages declare."""
    return [*BUILT_IN_ENVIRONMENTS, *declared_names(ENVIRONMENT_ENTRY_POINTS)]


class EnvironmentSettings(BaseModel):
    """An environment's own settings: its fields are fields of the ``environment`` section where environment.name
    names the environment, so each needs a default and a description, and a name none of the section's own fields
    has."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @classmethod
    def of(cls, section: EnvironmentConfig) -> Self:
        """These settings as ``section`` holds them (the defaults where it is another environment's)."""
        given = section.model_extra or {}
        return cls.model_validate({name: given[name] for name in cls.model_fields if name in given})

    def for_policy(self, model: str) -> Self:
        """These settings for a run of the policy ``model``: with what they derive from it filled in; ValueError,
        naming the setting to change, where they cannot serve it. As they are by default."""
        return self

    def target_demonstrations(self) -> float:
        """Share of the builtin tiny policy's demonstrations that are jobs of the target's shape
        (tasks/splits.sft_demonstrations); none by default, so checkpoint 0 has never seen one."""
        return 0.0

    def tiny_policy(self, policy: PolicyConfig) -> PolicyConfig:
        """The builtin tiny model's settings for this environment (what tasks/prepare.py builds checkpoint 0
        with): the policy section as given by default. An environment may replace a field with a setting of its own
        of the same name (the workplace: environment.sft_steps); a policy value given for that field is refused."""
        return policy


class NoSettings(EnvironmentSettings):
    """The settings of an environment that declares none."""


def settings_model(name: str) -> type[EnvironmentSettings]:
    """The settings model environment ``name`` declares (`NoSettings` where it declares none)."""
    if name in BUILT_IN_SETTINGS:
        point = EntryPoint(name, BUILT_IN_SETTINGS[name], SETTINGS_ENTRY_POINTS)
    elif name in BUILT_IN_ENVIRONMENTS:
        return NoSettings
    else:
        declared = {point.name: point for point in declared_points(SETTINGS_ENTRY_POINTS)}
        if name not in declared:
            return NoSettings
        point = declared[name]
    loaded: type[EnvironmentSettings] = load_declared(point, EnvironmentSettings, "coevolve/config/environment.py")
    return loaded


def _setting_owner(field: str) -> tuple[str, Any] | None:
    """The environment that declares a setting called ``field``, and the setting's default; None when none does."""
    for name in [*BUILT_IN_SETTINGS, *declared_names(SETTINGS_ENTRY_POINTS)]:
        info = settings_model(name).model_fields.get(field)
        if info is not None:
            return name, info.default
    return None


class EnvironmentConfig(Section):
    name: str = Field(
        "bfcl",
        description=(
            "Environment the agent plays. 'bfcl': BFCL v3 multi-turn, offline; 'workplace': a person's mail, calendar, "
            "contacts and project tasks, generated from a seed; an installed package may add others "
            "(entry-point group coevolve.environments, docs/extending.md)."
        ),
    )

    @field_validator("name")
    @classmethod
    def _known_environment(cls, value: str) -> str:
        if value in BUILT_IN_ENVIRONMENTS:
            return value
        known = environment_names()
        if value not in known:
            raise ValueError(
                f"unknown environment {value!r}; use one of {known}, or install the package that declares it"
            )
        return value

    max_steps: int = Field(
        30, ge=1, description="Model messages per episode before it counts as a failure (paper: 30)."
    )
    max_steps_per_turn: int = Field(
        4, ge=1, description="Model messages per user turn; a turn ends when the model calls no tool."
    )
    max_observation_chars: int = Field(
        80,
        ge=16,
        description=(
            "Tool results longer than this are cut in the prompt. Short for the builtin tiny model: results are most "
            "of its tokens and it only needs to see that the calls ran (paper-scale configs raise it)."
        ),
    )
    tool_list: Literal["described", "signatures", "names"] = Field(
        "names",
        description=(
            "How the system prompt lists tools: with signatures and descriptions, signatures only, or bare names. "
            "Bare names for the builtin tiny model: its prompts get about 5x shorter, so SFT and rollouts run several "
            "times faster and it learns arguments from demonstrations; 'described' for real LLMs (configs/paper.yaml)."
        ),
    )
    # An environment's own settings (its `EnvironmentSettings` model) are fields of this section too.
    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def _own_settings(self) -> EnvironmentConfig:
        given = dict(self.model_extra or {})
        model = settings_model(self.name)
        for field in [field for field in given if field not in model.model_fields]:
            owner = _setting_owner(field)
            if owner is None:
                raise PydanticCustomError(
                    "unknown_setting",
                    f"environment.{field}: unknown field; check its spelling against `coevolve config --show`.",
                )
            # Recorded configurations of other environments carry every built-in setting at its default (BFCL's
            # prompt_style and bfcl_handler were once fields of this section): at its default it says nothing.
            if given.pop(field) != owner[1]:
                raise PydanticCustomError(
                    "other_environment_setting",
                    f"environment.{field} is a setting of environment {owner[0]!r} and applies to environment.name "
                    f"{owner[0]!r} only; remove environment.{field} for {self.name!r}.",
                )
        try:
            settings = model.model_validate(given)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"])
            message = " ".join(str(error["msg"]).split())
            raise PydanticCustomError(
                "environment_setting", f"environment.{where}: {message}, not {error.get('input')!r}."
            ) from None
        self.__pydantic_extra__ = settings.model_dump()
        return self

    def settings(self) -> EnvironmentSettings:
        """The environment's own settings, as its model types them."""
        return settings_model(self.name).of(self)

"""The stages a round may place on a work pool are named in three places, and they name the same stages:
coevolve.stages.PLACEABLE (what the round flow places), PlacementConfig's fields (what a user sets) and the
stage deployments of prefect.yaml (what a worker runs)."""

from pathlib import Path

import yaml

from coevolve.config.placement import PlacementConfig
from coevolve.stages import PLACEABLE

REPO = Path(__file__).resolve().parents[2]
STAGE_ENTRYPOINT = "flows/stage.py:coevolve_stage"


def _config_stages() -> set[str]:
    """PlacementConfig's stage fields (a deployment name or 'inline'), by the names a user writes (``validate``, not
    the attribute ``validate_``)."""
    return {field.alias or name for name, field in PlacementConfig.model_fields.items() if field.annotation is str}


def _stage_deployments() -> list[dict]:
    deployments = yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]
    return [d for d in deployments if d["entrypoint"] == STAGE_ENTRYPOINT]


def test_every_placeable_stage_has_a_placement_setting_and_nothing_else_has_one():
    assert _config_stages() == set(PLACEABLE), (
        "coevolve/config/placement.py's stage fields and coevolve.stages.PLACEABLE differ: add or remove the field "
        "(and its name in the field validator) to match PLACEABLE"
    )


def test_prefect_yaml_deploys_every_placeable_stage_once_and_nothing_else():
    stages = [d["parameters"]["stage"] for d in _stage_deployments()]
    assert sorted(stages) == sorted(PLACEABLE), (
        "prefect.yaml's coevolve-stage deployments and coevolve.stages.PLACEABLE differ: add or remove a deployment "
        "'<stage>-cpu' or '<stage>-gpu' (`<<: *stage`, parameters {stage: <stage>}) to match PLACEABLE"
    )


def test_each_stage_deployment_is_named_after_its_stage_and_pool():
    for d in _stage_deployments():
        pool = d["work_pool"]["name"].removeprefix("coevolve-")
        assert d["name"] == f"{d['parameters']['stage']}-{pool}"


def test_the_placement_fields_validate_every_stage_setting():
    for stage in PLACEABLE:
        try:
            PlacementConfig.model_validate({stage: "not-a-deployment"})
        except ValueError as error:
            assert "neither 'inline' nor a deployment name" in str(error)
        else:
            raise AssertionError(f"placement.{stage} accepted a value that names no deployment")

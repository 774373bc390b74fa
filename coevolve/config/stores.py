"""Where records go: the MLflow store and model registry, and the trajectory warehouse."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from coevolve.config.base import Section
from coevolve.errors import ConfigError
from coevolve.redact import credential_keys


class TrackingConfig(Section):
    mlflow_uri: str | None = Field(
        None,
        description=(
            "MLflow tracking URI; None uses SQLite under state_dir. With a tracking server (`mlflow server "
            "--backend-store-uri sqlite:///... --serve-artifacts --host 127.0.0.1`), http://HOST:PORT: artifacts go "
            "through the server, so workers need no shared artifact folder."
        ),
    )
    register_checkpoints: Literal["copy", "uri"] = Field(
        "copy",
        description=(
            "How each round's checkpoint becomes a model version: 'copy' logs the checkpoint folder as artifacts "
            "(self-contained; a 4B model copies about 8 GB a round), 'uri' registers the folder where it already is "
            "(state_dir on shared storage), copying nothing; the folder must then be kept. 'uri' needs a store this "
            "process opens (SQLite): a tracking server refuses local folders as version sources."
        ),
    )
    experiment: str = Field("coevolve", description="MLflow experiment name.")
    registered_model: str = Field(
        "coevolve-policy",
        pattern=r"^[A-Za-z0-9_.-]+$",
        description=(
            "Prefix of the registry names. Each run registers its own model, '<prefix>-<run_id>', one version per "
            "round, so its aliases 'current' and 'best' rank that run's versions only (an ablation's arms and seeds "
            "never share them)."
        ),
    )


class WarehouseConfig(Section):
    uri: str | None = Field(
        None,
        description=(
            "Where the warehouse's table files and records live: a folder, or s3://bucket/prefix (fsspec with s3fs: "
            "pip install -e '.[s3]'; the bucket must exist). None keeps them under state_dir/warehouse. Every machine "
            "that runs a stage must see the same place; checkpoints, pool snapshots and MLflow stay under state_dir."
        ),
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "fsspec options for uri (for s3://, s3fs.S3FileSystem's arguments), e.g. {'endpoint_url': "
            "'http://127.0.0.1:9000'} for an S3-compatible server (MinIO, moto), {'client_kwargs': {'region_name': "
            "'eu-west-1'}} for a region. Credentials are refused here: they come from the environment "
            "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN for s3://). Listings are never cached "
            "(use_listings_cache defaults to False for URLs), so every reader sees files other processes wrote since."
        ),
    )
    flush_every: int = Field(
        64,
        ge=1,
        description=(
            "Finished episodes the rollout stage collects before writing them: a failure late in the stage loses "
            "at most this many, and a resumed stage plays only the episodes not yet stored. Each batch is two "
            "files made durable (fsync), about 5 ms each here, so much smaller batches slow writes and leave "
            "many small files (benchmarks/README.md, warehouse)."
        ),
    )
    # Two minutes: the analysis views answer in seconds over a run's warehouse, while an endless query (a recursive
    # CTE with no end) otherwise runs until someone kills it.
    query_timeout_s: float | None = Field(
        120.0,
        gt=0,
        description=(
            "Seconds a `coevolve sql` query may run before it is stopped (`--timeout S` changes it for one query, "
            "`--timeout 0` lifts it); None: no limit."
        ),
    )
    # 1 GiB: the whole of this default's warehouse several times over; beyond it DuckDB spills to a folder of its
    # own under state_dir/tmp, at most four times this (storage/views.py), so a query may need more and still answer.
    query_memory_mb: int = Field(
        1024,
        ge=64,
        description="Memory a `coevolve sql` query may hold (DuckDB's memory_limit) before it spills to disk.",
    )

    @field_validator("storage_options", mode="after")
    @classmethod
    def _no_credentials(cls, value: dict[str, Any]) -> dict[str, Any]:
        # The configuration is stored whole (Prefect's flow-run parameters, the warehouse's run record, MLflow
        # params), so a credential in it would be kept in clear in all three. Raised as ConfigError, not
        # ValueError, so the message is one line and never echoes the values given.
        found = credential_keys(value)
        if found:
            raise ConfigError(
                f"warehouse.storage_options holds credentials ({', '.join(found)}), which would be stored with the "
                "configuration; remove them and set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and "
                "AWS_SESSION_TOKEN) in the environment instead (another filesystem: its own credential variables)."
            )
        return value

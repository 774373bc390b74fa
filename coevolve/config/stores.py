"""Where records go: the MLflow store and model registry, and the trajectory warehouse."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from coevolve.config.base import Section


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
            "'eu-west-1'}} for a region. Credentials are better left to the usual AWS_* variables (or key/secret here "
            "only in a private file). Listings are never cached (use_listings_cache defaults to False for URLs), so "
            "every reader sees files other processes wrote since."
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

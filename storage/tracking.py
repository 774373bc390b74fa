"""MLflow tracking: one MLflow run per round linking checkpoint version, pool digest and flow run.

Every MLflow call of the project lives here. The tracker talks to the store through an
`MlflowClient` (no fluent global state), so several trackers and threads can coexist.

Each run of the pipeline registers its own model, ``<tracking.registered_model>-<run_id>``, so the
aliases ``current`` (newest round) and ``best`` (highest held-out success) rank that run's versions
only, never another arm's or seed's.

Lineage is kept in tags on both the MLflow run and the model version (the names in `LINEAGE_TAGS`):
the version of checkpoint r+1 names the pool it was trained from (``pool_digest``, pool r, also
logged as the run's "training" dataset input), the pool its round produced
(``produced_pool_digest``, pool r+1, a "produced" dataset input), its parent version and the
parent checkpoint's digest, the Prefect flow run, and the trajectories it was trained on.
`find_versions_for_pool` goes digest -> versions, `pool_for_version` goes version -> digest, and
`lineage` walks a version back to checkpoint 0 and D_0.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import polars as pl
from sqlalchemy.exc import SQLAlchemyError

from coevolve.errors import DataError, InfrastructureError
from coevolve.optional import optional_module
from coevolve.redact import redact_params
from storage.mlflow_store import (
    check_checkpoint_registration,
    check_store_file,
    damaged_store,
    is_busy,
    is_tracking_server,
    sqlite_file,
)
from storage.relocation import follow_moved_mlflow_store

# MLflow is slow to import (over a second), and it decides at import whether to send usage telemetry
# (mlflow/__init__.py builds its telemetry client from MLFLOW_DISABLE_TELEMETRY then). It is imported on
# the first Tracker call, so flows and workers that never track load cheaply, and the default below is in
# place by then; an operator's own setting of the variable wins.
mlflow = optional_module("mlflow")
mlflow_data = optional_module("mlflow.data")
mlflow_entities = optional_module("mlflow.entities")
mlflow_exceptions = optional_module("mlflow.exceptions")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

# MLflow reserves the alias "latest" (models:/<name>/latest already means the newest version),
# so the newest round's version gets this alias instead.
CURRENT_ALIAS = "current"
# The version with the highest held-out success so far (the earliest one on ties).
BEST_ALIAS = "best"

RUN_NAME_TAG = "coevolve.run_name"
VERSION_TAG = "coevolve.model_version"
POOL_DIGEST_TAG = "pool_digest"  # the pool a version was trained from
PRODUCED_POOL_TAG = "produced_pool_digest"  # the pool its round produced
FLOW_RUN_TAG = "flow_run_id"
PARENT_VERSION_TAG = "parent_version"  # empty for round 0, whose parent is checkpoint 0
# Tags every version carries, in the order `coevolve lineage` prints them.
LINEAGE_TAGS = (
    "coevolve.run_id",
    "coevolve.round",
    "checkpoint_digest",
    POOL_DIGEST_TAG,
    PRODUCED_POOL_TAG,
    PARENT_VERSION_TAG,
    "parent_checkpoint",
    "parent_checkpoint_digest",
    FLOW_RUN_TAG,
    "trajectories.run_id",
    "trajectories.round",
    "trajectories.count",
    "trajectories.ids_digest",
    # Set when the run's round-0 trajectories and checkpoint 1 were copied from another arm of its seed
    # (flows/ablation_round0.py).
    "trajectories.copied_from",
)

# MLflow's limit on metrics in one log_batch call.
_METRICS_PER_BATCH = 1000
# The dataset digest column of MLflow's store holds at most 36 characters; the full digest goes
# into the dataset name and the tags.
_DATASET_DIGEST_CHARS = 32


def is_duplicate_dataset(exc: BaseException) -> bool:
    """Whether ``exc`` is the store refusing a second copy of a dataset (name and digest) in an experiment: SQLite's
    and other databases' unique-key errors, as MLflow passes them on."""
    text = str(exc).lower()
    return "datasets" in text and ("unique constraint" in text or "duplicate key" in text)


def _local(uri: str) -> str:
    """A ``file://`` URI as the path it names (what `cp` takes); any other URI as it is."""
    return url2pathname(urlparse(uri).path) if uri.startswith("file://") else uri


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


class Tracker:
    """Records rounds in MLflow and answers lineage queries between pools and model versions."""

    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        artifacts_dir: Path,
        registered_model: str | None = None,
        read_only: bool = False,
    ) -> None:
        """``read_only``: for queries (`coevolve lineage`): the store is opened without writing to it (no experiment
        created, no moved folder re-rooted), so a read-only state folder answers; a missing store is a DataError."""
        self.tracking_uri = tracking_uri
        self.registered_model = registered_model
        # A store file on this machine that is damaged stays damaged: that is a DataError, never retried.
        # A store behind a server (http, a database server) may come back: InfrastructureError, retried.
        store_file = sqlite_file(tracking_uri)
        if store_file is not None:
            if read_only and not store_file.is_file():
                raise DataError(
                    f"no MLflow store at {store_file}: no round of this state folder has been recorded; run "
                    "`coevolve evolve` first, or name the state folder of a run with --set state_dir=DIR."
                )
            check_store_file(store_file, writable=not read_only)
            if not read_only:
                # A state folder copied or restored elsewhere logs into itself from now on, never into the original.
                follow_moved_mlflow_store(store_file, Path(artifacts_dir))
        try:
            self.client = mlflow.MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
            if read_only:
                found = self.client.get_experiment_by_name(experiment)
                self.experiment_id = "" if found is None else found.experiment_id
            else:
                self.experiment_id = self._experiment(experiment, Path(artifacts_dir))
        except (mlflow_exceptions.MlflowException, SQLAlchemyError) as exc:
            if store_file is None or is_busy(exc):
                raise InfrastructureError(f"MLflow store {tracking_uri} is not usable: {exc}") from exc
            raise damaged_store(store_file, str(exc).splitlines()[0]) from exc
        except OSError as exc:
            raise DataError(
                f"MLflow store {tracking_uri} or its artifact folder {artifacts_dir} cannot be used: {exc}"
            ) from exc

    def _experiment(self, experiment: str, artifacts_dir: Path) -> str:
        found = self.client.get_experiment_by_name(experiment)
        if found is not None:
            return found.experiment_id
        location = None  # a tracking server keeps artifacts where it was told to (--serve-artifacts)
        if not is_tracking_server(self.tracking_uri):
            artifacts = artifacts_dir.resolve()
            artifacts.mkdir(parents=True, exist_ok=True)
            location = artifacts.as_uri()
        try:
            return self.client.create_experiment(experiment, artifact_location=location)
        except mlflow_exceptions.MlflowException as exc:
            # Another process created it between the lookup and the create.
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            return self.client.get_experiment_by_name(experiment).experiment_id

    # -- runs --------------------------------------------------------------------------------------

    def _runs_named(self, run_name: str, finished_only: bool) -> list[Any]:
        query = f"tags.`{RUN_NAME_TAG}` = '{_quote(run_name)}'"
        if finished_only:
            query += " and attributes.status = 'FINISHED'"
        return list(self.client.search_runs([self.experiment_id], query, order_by=["attributes.start_time DESC"]))

    def _info(self, run: Any) -> dict[str, str]:
        tags = run.data.tags
        name = tags.get("registered_model", "")
        version = tags.get(VERSION_TAG, "")
        return {"mlflow_run_id": run.info.run_id, "model_version": version, "model_uri": f"models:/{name}/{version}"}

    def log_round(
        self,
        run_name: str,
        params: dict[str, Any],
        metrics: dict[str, float],
        pool_path: Path,
        pool_digest: str,
        checkpoint_dir: Path,
        registered_model: str,
        flow_run_id: str,
        tags: dict[str, str],
        training_pool_path: Path | None = None,
        training_pool_digest: str | None = None,
        checkpoint_uri: str | None = None,
        checkpoint_exclude: tuple[str, ...] = (),
        step_metrics: list[tuple[str, float, int]] | None = None,
    ) -> dict[str, str]:
        """Logs one round in one MLflow run and registers its checkpoint as a new model version.

        ``metrics`` are the round's, logged at step 0; ``step_metrics`` are ``(name, value, step)`` measured along
        the round (each optimizer step's loss and KL at its global step, each training step's stage costs), which
        MLflow charts against their steps across the run's rounds.

        ``checkpoint_exclude`` names top-level entries of the checkpoint folder that are not copied into
        the artifacts (the optimizer state, as large as the weights several times over, serves only a
        resume, which reads it from the checkpoint folder).

        ``training_pool_*`` is the pool the checkpoint was trained from (pool r), ``pool_*`` the pool
        the round produced (pool r+1); both are logged as dataset inputs and artifacts. Without a
        training pool, ``pool_digest`` is the only pool and is tagged as the training pool.
        With ``checkpoint_uri`` (a folder on shared storage) the version is registered at that URI and
        nothing is copied; without it the checkpoint folder is logged as the run's artifacts.

        Idempotent: when a finished run with this run_name already registered a version, its info
        is returned and nothing is logged. A run left unfinished by a crash after it registered its
        version is finished instead of logged again, so a round never gets two versions; one that
        crashed earlier is marked FAILED and the round is logged again from scratch.
        """
        self.registered_model = registered_model
        for run in self._runs_named(run_name, finished_only=True):
            if run.data.tags.get(VERSION_TAG):
                return self._info(run)
        for stale in self._runs_named(run_name, finished_only=False):
            if stale.info.status == "FINISHED":
                continue
            registered = self._versions_of_run(registered_model, stale.info.run_id)
            if registered:
                return self._adopt(stale.info.run_id, registered_model, registered[0])
            if stale.info.status == "RUNNING":
                self.client.set_terminated(stale.info.run_id, "FAILED")
        if checkpoint_uri is not None and checkpoint_uri.startswith("file:"):
            check_checkpoint_registration(self.tracking_uri, "uri")
        if not Path(pool_path).is_file():
            raise DataError(f"Pool snapshot {pool_path} does not exist; write it before logging the round.")
        if not Path(checkpoint_dir).is_dir():
            raise DataError(f"Checkpoint directory {checkpoint_dir} does not exist; save the checkpoint first.")

        if training_pool_path is not None and not Path(training_pool_path).is_file():
            raise DataError(
                f"Pool snapshot {training_pool_path} does not exist; the round's training pool must be snapshotted "
                "first."
            )
        trained_from = training_pool_digest or pool_digest
        link = {
            POOL_DIGEST_TAG: trained_from,
            PRODUCED_POOL_TAG: pool_digest,
            FLOW_RUN_TAG: flow_run_id,
            **{k: str(v) for k, v in tags.items()},
        }
        run = self.client.create_run(
            self.experiment_id,
            run_name=run_name,
            tags={RUN_NAME_TAG: run_name, "registered_model": registered_model, **link},
        )
        run_id = run.info.run_id
        try:
            # Params are kept in clear in the store: a credential that reached them is masked (coevolve/redact.py).
            self.client.log_batch(
                run_id,
                metrics=[mlflow_entities.Metric(k, float(v), 0, 0) for k, v in metrics.items()],
                params=[mlflow_entities.Param(k, str(v)[:6000]) for k, v in redact_params(params).items()],
            )
            along = [mlflow_entities.Metric(k, float(v), 0, int(step)) for k, v, step in step_metrics or []]
            for start in range(0, len(along), _METRICS_PER_BATCH):
                self.client.log_batch(run_id, metrics=along[start : start + _METRICS_PER_BATCH])
            if training_pool_path is not None and training_pool_digest:
                self._log_pool(run_id, Path(training_pool_path), training_pool_digest, "training")
                self._log_pool(run_id, Path(pool_path), pool_digest, "produced")
            else:
                self._log_pool(run_id, Path(pool_path), pool_digest, "training")
            if checkpoint_uri is None:
                for entry in sorted(Path(checkpoint_dir).iterdir()):
                    if entry.name in checkpoint_exclude:
                        continue
                    if entry.is_dir():
                        self.client.log_artifacts(run_id, str(entry), f"checkpoint/{entry.name}")
                    else:
                        self.client.log_artifact(run_id, str(entry), "checkpoint")
                source = f"{run.info.artifact_uri}/checkpoint"
            else:
                source = checkpoint_uri
            version = self._register(registered_model, source, run_id, {RUN_NAME_TAG: run_name, **link})
            self.client.set_tag(run_id, VERSION_TAG, version)
            self.client.set_terminated(run_id, "FINISHED")
        except BaseException:
            self.client.set_terminated(run_id, "FAILED")
            raise
        return {"mlflow_run_id": run_id, "model_version": version, "model_uri": f"models:/{registered_model}/{version}"}

    def _versions_of_run(self, name: str, run_id: str) -> list[str]:
        try:
            found = self.client.search_model_versions(f"name = '{_quote(name)}' and run_id = '{_quote(run_id)}'")
        except mlflow_exceptions.MlflowException:
            return []  # the registered model does not exist yet
        return sorted((str(v.version) for v in found), key=int)

    def _adopt(self, run_id: str, name: str, version: str) -> dict[str, str]:
        # Everything the run logs comes before its registration, so only the closing calls are missing.
        self.client.set_registered_model_alias(name, CURRENT_ALIAS, version)
        self.client.set_tag(run_id, VERSION_TAG, version)
        self.client.set_terminated(run_id, "FINISHED")
        return {"mlflow_run_id": run_id, "model_version": version, "model_uri": f"models:/{name}/{version}"}

    def _log_pool(self, run_id: str, pool_path: Path, pool_digest: str, context: str) -> None:
        frame = pl.read_parquet(pool_path)
        with warnings.catch_warnings():
            # A local path matches two equivalent source types; MLflow warns and picks one.
            warnings.simplefilter("ignore")
            dataset = mlflow_data.from_polars(
                # The file's stem keeps pool r and pool r+1 two inputs even when no task was added.
                frame,
                source=str(pool_path.resolve()),
                name=f"{pool_path.stem}-{pool_digest}",
                digest=pool_digest[:_DATASET_DIGEST_CHARS],
            )
        tags = [mlflow_entities.InputTag("mlflow.data.context", context)]
        inputs = [mlflow_entities.DatasetInput(dataset._to_mlflow_entity(), tags=tags)]
        try:
            self.client.log_inputs(run_id, inputs)
        except mlflow_exceptions.MlflowException as exc:
            # Runs of one experiment can log the same pool at the same moment (an ablation's seeds share D_0, and a
            # static arm's pools stay D_0): both find no such dataset and insert it, and the second insert breaks
            # the store's unique key. The dataset exists now, so logging again links this run to it.
            if not is_duplicate_dataset(exc):
                raise
            self.client.log_inputs(run_id, inputs)
        self.client.log_artifact(run_id, str(pool_path), "pool")

    def _register(self, name: str, source: str, run_id: str, tags: dict[str, str]) -> str:
        try:
            self.client.create_registered_model(name)
        except mlflow_exceptions.MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        # MLflow 3 resolves runs:/ sources to logged models; the full artifact URI registers the directory.
        version = self.client.create_model_version(name, source, run_id=run_id, tags=tags)
        self.client.set_registered_model_alias(name, CURRENT_ALIAS, version.version)
        return str(version.version)

    # -- registry and lineage ----------------------------------------------------------------------

    def find_versions_for_pool(self, digest: str, name: str | None = None) -> list[str]:
        """Model versions trained with the pool of this digest (of `name`, or of every model)."""
        query = f"tags.{POOL_DIGEST_TAG} = '{_quote(digest)}'"
        name = name or self.registered_model
        if name:
            query = f"name = '{_quote(name)}' and " + query
        versions = self.client.search_model_versions(query)
        return sorted((str(v.version) for v in versions), key=int)

    def pool_for_version(self, version: str, name: str | None = None) -> str:
        """The pool digest a model version was trained with."""
        name = name or self.registered_model or self._only_model()
        try:
            found = self.client.get_model_version(name, str(version))
        except mlflow_exceptions.MlflowException as exc:
            raise DataError(f"Model {name!r} has no version {version}: {exc}") from exc
        digest = found.tags.get(POOL_DIGEST_TAG)
        if not digest:
            raise DataError(
                f"Model {name!r} version {version} has no {POOL_DIGEST_TAG} tag; it was not logged by log_round."
            )
        return digest

    def version_tags(self, name: str, version: str) -> dict[str, str]:
        """The lineage tags of one model version, given by number or alias (``current``, ``best``);
        DataError when missing."""
        try:
            if str(version).isdigit():
                found = self.client.get_model_version(name, str(version))
            else:
                found = self.client.get_model_version_by_alias(name, str(version))
        except mlflow_exceptions.MlflowException as exc:
            raise DataError(
                f"Model {name!r} has no version {version}: give a version number or an alias "
                f"({CURRENT_ALIAS!r}, {BEST_ALIAS!r}). {exc.message}"
            ) from exc
        # Where MLflow keeps the version's files: its checkpoint copy (the folder itself with
        # tracking.register_checkpoints=uri) and its round's run artifacts (pool/ holds the round's pools).
        run_artifacts = ""
        if found.run_id:
            with contextlib.suppress(mlflow_exceptions.MlflowException):
                run_artifacts = str(self.client.get_run(found.run_id).info.artifact_uri or "")
        return {
            "version": str(found.version),
            **{k: found.tags.get(k, "") for k in LINEAGE_TAGS},
            "checkpoint_artifacts": _local(str(found.source or "")),
            "run_artifacts": _local(run_artifacts),
        }

    def registered_parent(self, name: str, version: str, checkpoint_digest: str) -> str:
        """``version`` when this store holds it as the checkpoint of ``checkpoint_digest``; else "".

        A round's parent version comes from the warehouse's record of the round before. After its MLflow store was
        moved aside (the way back from a damaged one) that number names a version of the old store: the new store
        has none of that number, or another checkpoint under it, and a version naming it would break lineage.
        """
        if not version:
            return ""
        try:
            found = self.client.get_model_version(name, str(version))
        except mlflow_exceptions.MlflowException:
            return ""
        return str(version) if found.tags.get("checkpoint_digest") == checkpoint_digest else ""

    def lineage(self, name: str, version: str) -> list[dict[str, str]]:
        """``version`` (a number or an alias) and each parent in turn, newest first, down to the version trained
        from checkpoint 0.

        The last entry's ``parent_checkpoint`` / ``parent_checkpoint_digest`` are checkpoint 0 and its
        ``pool_digest`` is D_0. Raises DataError when a parent is missing or the chain loops.
        """
        chain = [self.version_tags(name, version)]
        while chain[-1][PARENT_VERSION_TAG]:
            parent = chain[-1][PARENT_VERSION_TAG]
            if any(entry["version"] == parent for entry in chain) or len(chain) > 10_000:
                raise DataError(f"Model {name!r}: the parent chain of version {version} loops at version {parent}.")
            chain.append(self.version_tags(name, parent))
        return chain

    def _only_model(self) -> str:
        names = [m.name for m in self.client.search_registered_models()]
        if len(names) != 1:
            raise DataError(f"Name the registered model: the store holds {len(names)} ({', '.join(names)}).")
        return names[0]

    def update_best(self, name: str, metric: str = "heldout_success") -> str | None:
        """Points alias "best" at the version whose run logged the highest ``metric``; returns it.

        Recomputed from every version each time, so a re-run or a resumed round sets the same
        alias; on ties the earliest version keeps it. None when no version has the metric.
        """
        try:
            versions = self.client.search_model_versions(f"name = '{_quote(name)}'")
        except mlflow_exceptions.MlflowException:
            return None
        scored: list[tuple[float, int]] = []
        for version in versions:
            if not version.run_id:
                continue
            value = self.client.get_run(version.run_id).data.metrics.get(metric)
            if value is not None:
                scored.append((float(value), -int(version.version)))
        if not scored:
            return None
        best = str(-max(scored)[1])
        self.client.set_registered_model_alias(name, BEST_ALIAS, best)
        return best

    def attach_artifact(self, mlflow_run_id: str, path: Path, folder: str = "figures") -> None:
        """Adds a file to an existing run (finished or not), under ``folder``; the same name replaces it."""
        self.client.log_artifact(mlflow_run_id, str(path), folder)

    def log_evaluation(
        self, run_name: str, metrics: dict[str, float], params: dict[str, Any], tags: dict[str, str]
    ) -> str:
        """Logs one evaluation of a checkpoint as its own finished MLflow run; returns the run id."""
        run = self.client.create_run(
            self.experiment_id,
            run_name=run_name,
            tags={RUN_NAME_TAG: run_name, "coevolve.kind": "evaluation", **{k: str(v) for k, v in tags.items()}},
        )
        try:
            self.client.log_batch(
                run.info.run_id,
                metrics=[mlflow_entities.Metric(k, float(v), 0, 0) for k, v in metrics.items()],
                params=[mlflow_entities.Param(k, str(v)[:6000]) for k, v in redact_params(params).items()],
            )
        except BaseException:
            self.client.set_terminated(run.info.run_id, "FAILED")
            raise
        self.client.set_terminated(run.info.run_id, "FINISHED")
        return run.info.run_id

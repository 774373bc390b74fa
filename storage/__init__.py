"""Persistence: the DuckDB warehouse, immutable pool snapshots and MLflow tracking.

Every SQL statement and every MLflow call of the project lives in this package.
"""

from storage.pool import pool_digest, read_pool_snapshot, write_pool_snapshot
from storage.warehouse import STAGES, Warehouse

__all__ = ["STAGES", "Warehouse", "pool_digest", "read_pool_snapshot", "write_pool_snapshot"]

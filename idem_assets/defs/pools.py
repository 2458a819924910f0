"""The warehouse pool's slot, stored when the location loads, before any run can be queued.

Dagster 1.13's run queue reads the list of pools that have a limit before it stores
``pools.default_limit`` for a pool it meets for the first time, so on a fresh instance the first
dequeue pass treats ``duckdb_warehouse`` as unlimited and starts up to ``max_concurrent_runs``
warehouse runs together (``QueuedRunCoordinatorDaemon._get_runs_to_dequeue`` fetches
``get_concurrency_keys()`` before ``GlobalOpConcurrencyLimitsCounter._initialize_pool_limits``).
Every way of starting Dagster loads the location before it can queue a run of it (the webserver,
the daemon, ``dagster job backfill``, ``dg launch``), so storing the limit here closes that gap.
"""

import functools
import os
from pathlib import Path
from typing import Literal

import dagster as dg

from idem_assets.defs.partitions import WAREHOUSE_POOL, WAREHOUSE_SLOTS
from idem_assets.defs.warehouse import engine

PoolOutcome = Literal["kept", "from_default", "set", "unsupported"]


def ensure_warehouse_pool(
    instance: dg.DagsterInstance, slots: int = WAREHOUSE_SLOTS, multi_writer: bool = False
) -> PoolOutcome:
    """Store the warehouse pool's limit unless the instance already has one; say what happened.

    A limit someone set (``dagster instance concurrency set``) is kept. A warehouse that takes
    one writer gets the instance's ``pools.default_limit``, stored the way the run queue would
    store it, so editing dagster.yaml still changes it, or ``slots`` on an instance without that
    setting. A multi-writer warehouse (PostgreSQL) gets ``slots``: the default limit is meant
    for pools nobody sized.
    """
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return "unsupported"
    if WAREHOUSE_POOL in storage.get_concurrency_keys():
        return "kept"
    if not multi_writer and instance.global_op_concurrency_default_limit is not None:
        storage.initialize_concurrency_limit_to_default(WAREHOUSE_POOL)
        return "from_default"
    storage.set_concurrency_slots(WAREHOUSE_POOL, slots)
    return "set"


@functools.cache
def _ensure_in_home(home: str) -> PoolOutcome:
    """Once per process and DAGSTER_HOME: step processes load the location too."""
    with dg.DagsterInstance.get() as instance:
        return ensure_warehouse_pool(instance, WAREHOUSE_SLOTS, engine().multi_writer)


@dg.definitions
def warehouse_pool() -> dg.Definitions:
    """Store the warehouse pool's limit in the instance that loads the location, if it has one."""
    home = os.environ.get("DAGSTER_HOME")
    # Without DAGSTER_HOME there is no lasting instance to store it in (dg.materialize in tests,
    # or `dg dev` on a throwaway instance that has none of dagster.yaml's limits either).
    if home and Path(home).is_dir():
        _ensure_in_home(home)
    return dg.Definitions()

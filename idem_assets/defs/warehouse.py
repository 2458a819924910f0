"""The warehouse the code location writes: DuckDB by default, or PostgreSQL, Delta, Iceberg, Spark.

``IDEM_WAREHOUSE=duckdb|postgres|delta|iceberg|spark`` chooses the engine. Each engine is one
entry of :data:`ENGINES`: how to build its overwrite and merge IO managers from the
environment, and how many runs may write it at once. Everything else in the code location reads
and writes through those IO managers, so another engine is one more entry.
"""

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import idem_assets as ia

WAREHOUSE_ENV = "IDEM_WAREHOUSE"
DEFAULT_ENGINE = "duckdb"
#: Runs that may write a multi-writer warehouse at once (PostgreSQL); DuckDB always has one.
SLOTS_ENV = "IDEM_WAREHOUSE_SLOTS"

REPO_ROOT = Path(__file__).resolve().parents[2]

#: Where the Delta tables live: a folder, or an object-store URI (``s3://bucket/lake``) whose
#: credentials delta-rs reads from the environment (AWS_* variables).
DELTA_ROOT = "IDEM_DELTA_ROOT"

#: The Spark session's settings as a JSON object (``{"spark.master": "spark://host:7077", ...}``);
#: unset, local Spark with a Derby metastore and the warehouse under ``.data/spark``.
SPARK_CONF = "IDEM_SPARK_CONF"

#: The PostgreSQL warehouse's connection, from the environment; the password only from
#: IDEM_PG_PASSWORD, read when a connection opens (never in config, logs or metadata).
PG_HOST, PG_PORT, PG_USER, PG_DB, PG_PASSWORD = (
    "IDEM_PG_HOST",
    "IDEM_PG_PORT",
    "IDEM_PG_USER",
    "IDEM_PG_DB",
    "IDEM_PG_PASSWORD",
)


@dataclass(frozen=True)
class Engine:
    """One warehouse engine: its IO managers and how many runs may write it at once."""

    name: str
    #: Runs that may write at once unless IDEM_WAREHOUSE_SLOTS says otherwise.
    slots: int
    #: Whether more than one process may write it (IDEM_WAREHOUSE_SLOTS may raise ``slots``).
    multi_writer: bool
    #: The overwrite and the merge IO manager, built from the environment.
    io_managers: Callable[[], tuple[ia.IdempotentIOManager, ia.IdempotentIOManager]]
    #: Why the pool has its slots, shown in the UI with the job.
    pool_reason: str


def warehouse_path() -> str:
    """The DuckDB file: ``$IDEM_DUCKDB_PATH``, else ``.data/warehouse.duckdb`` in the checkout."""
    return os.environ.get("IDEM_DUCKDB_PATH") or str(REPO_ROOT / ".data" / "warehouse.duckdb")


def duckdb_io_managers() -> tuple[ia.IdempotentIOManager, ia.IdempotentIOManager]:
    """Both IO managers on one DuckDB file."""
    database = warehouse_path()
    Path(database).parent.mkdir(parents=True, exist_ok=True)
    return ia.DuckDBOverwriteIOManager(database=database), ia.DuckDBMergeIOManager(
        database=database
    )


def postgres_io_managers() -> tuple[ia.IdempotentIOManager, ia.IdempotentIOManager]:
    """Both IO managers on the PostgreSQL database the IDEM_PG_* variables name."""
    connection = {
        "host": os.environ.get(PG_HOST, "localhost"),
        "port": int(os.environ.get(PG_PORT, "5432")),
        "user": os.environ.get(PG_USER, "postgres"),
        "database": os.environ.get(PG_DB, "idem_assets"),
        "password_env": PG_PASSWORD,
    }
    return ia.PostgresOverwriteIOManager(**connection), ia.PostgresMergeIOManager(**connection)


def delta_root() -> str:
    """The Delta tables' root: ``$IDEM_DELTA_ROOT``, else ``.data/lake`` in the checkout."""
    return os.environ.get(DELTA_ROOT) or str(REPO_ROOT / ".data" / "lake")


def delta_io_managers() -> tuple[ia.IdempotentIOManager, ia.IdempotentIOManager]:
    """Both IO managers on the Delta tables under :func:`delta_root`."""
    root = delta_root()
    if "://" not in root:
        Path(root).mkdir(parents=True, exist_ok=True)
    return ia.DeltaOverwriteIOManager(root=root), ia.DeltaMergeIOManager(root=root)


#: The Iceberg catalog (``sqlite:////path``, ``postgresql+psycopg2://user@host/db`` or a REST
#: URL) and warehouse (a folder or ``s3://...``); a PostgreSQL catalog's password only from
#: IDEM_ICEBERG_PASSWORD, read when the catalog opens.
ICEBERG_CATALOG, ICEBERG_WAREHOUSE, ICEBERG_PASSWORD = (
    "IDEM_ICEBERG_CATALOG",
    "IDEM_ICEBERG_WAREHOUSE",
    "IDEM_ICEBERG_PASSWORD",
)


def iceberg_io_managers() -> tuple[ia.IdempotentIOManager, ia.IdempotentIOManager]:
    """Both IO managers on the Iceberg catalog the IDEM_ICEBERG_* variables name.

    Unset, a SQLite catalog file and a warehouse folder under ``.data/iceberg`` in the checkout.
    """
    local = REPO_ROOT / ".data" / "iceberg"
    catalog = os.environ.get(ICEBERG_CATALOG) or f"sqlite:///{local / 'catalog.db'}"
    warehouse = os.environ.get(ICEBERG_WAREHOUSE) or f"file://{local / 'warehouse'}"
    if "://" not in warehouse:
        warehouse = f"file://{Path(warehouse).resolve()}"
    config = {
        "catalog_uri": catalog,
        "warehouse": warehouse,
        "password_env": ICEBERG_PASSWORD if catalog.startswith("postgresql") else None,
    }
    return ia.IcebergOverwriteIOManager(**config), ia.IcebergMergeIOManager(**config)


def spark_conf() -> dict[str, str]:
    """The Spark settings: ``$IDEM_SPARK_CONF``, else local Spark under ``.data/spark``."""
    given = os.environ.get(SPARK_CONF)
    if given:
        return {str(k): str(v) for k, v in json.loads(given).items()}
    root = REPO_ROOT / ".data" / "spark"
    return {
        "spark.master": "local[*]",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.warehouse.dir": str(root / "warehouse"),
        "spark.hadoop.javax.jdo.option.ConnectionURL": (
            f"jdbc:derby:;databaseName={root / 'metastore_db'};create=true"
        ),
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={root}",
    }


def spark_io_managers() -> tuple[ia.IdempotentIOManager, ia.IdempotentIOManager]:
    """Both IO managers on the Spark session :func:`spark_conf` configures."""
    conf = spark_conf()
    return ia.SparkOverwriteIOManager(spark_conf=conf), ia.SparkMergeIOManager(spark_conf=conf)


ENGINES: dict[str, Engine] = {
    "duckdb": Engine(
        name="duckdb",
        slots=1,
        multi_writer=False,
        io_managers=duckdb_io_managers,
        pool_reason=(
            "DuckDB lets one process at a time open the warehouse file for writing, so runs that"
            " write it wait in the queue, oldest first, instead of failing on the file lock."
        ),
    ),
    "postgres": Engine(
        name="postgres",
        slots=3,
        multi_writer=True,
        io_managers=postgres_io_managers,
        pool_reason=(
            "PostgreSQL takes several writers: runs of different days write in parallel, and two"
            " writers of the same day take turns on that day's lock."
        ),
    ),
    "delta": Engine(
        name="delta",
        slots=3,
        multi_writer=True,
        io_managers=delta_io_managers,
        pool_reason=(
            "Delta Lake commits optimistically: runs of different days write files of their own"
            " and both commit, and two writers of the same day retry, so neither doubles it."
        ),
    ),
    "iceberg": Engine(
        name="iceberg",
        slots=3,
        multi_writer=True,
        io_managers=iceberg_io_managers,
        pool_reason=(
            "Iceberg commits optimistically: a writer whose commit loses to another run's starts"
            " over from the guards on the new snapshot, so runs of different days both commit"
            " and two writers of the same day leave one batch."
        ),
    ),
    "spark": Engine(
        name="spark",
        slots=1,
        # More than one only with an external Hive metastore: an embedded one admits one process.
        multi_writer=True,
        io_managers=spark_io_managers,
        pool_reason=(
            "Spark's embedded metastore admits one process: runs wait in the queue. With a"
            " cluster's Hive metastore (spark.hadoop.hive.metastore.uris), raise"
            " IDEM_WAREHOUSE_SLOTS: commits to one table take turns on its lock."
        ),
    ),
}


def engine_name() -> str:
    """The engine ``$IDEM_WAREHOUSE`` names (``duckdb`` when unset)."""
    name = (os.environ.get(WAREHOUSE_ENV) or DEFAULT_ENGINE).strip().lower()
    if name not in ENGINES:
        raise ia.ConfigurationError(
            f"{WAREHOUSE_ENV}={name!r} names no warehouse engine. Nothing was changed. Fix: set"
            f" {WAREHOUSE_ENV} to one of {sorted(ENGINES)} (unset means {DEFAULT_ENGINE!r})."
        )
    return name


def engine() -> Engine:
    """The warehouse engine the environment chooses."""
    return ENGINES[engine_name()]


def warehouse_slots() -> int:
    """Runs that may write the warehouse at once: the engine's, or ``$IDEM_WAREHOUSE_SLOTS``."""
    chosen = engine()
    value = os.environ.get(SLOTS_ENV)
    if value is None or value == "":
        return chosen.slots
    if not value.isdigit() or int(value) < 1 or (int(value) > 1 and not chosen.multi_writer):
        allowed = "a whole number of at least 1" if chosen.multi_writer else "1"
        raise ia.ConfigurationError(
            f"{SLOTS_ENV}={value!r} is not a slot count the {chosen.name} warehouse takes."
            f" Nothing was changed. Fix: set {SLOTS_ENV} to {allowed}, or unset it for"
            f" {chosen.slots}."
        )
    return int(value)

"""Fixtures every test directory may use (a real PostgreSQL server), and how tests share workers."""

import os
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from postgres_server import PostgresServer, PostgresUnavailableError, find_bin_dir
from xdist.remote import Producer
from xdist.scheduler import LoadGroupScheduling, Scheduling

from idem_assets.lib.backends.postgres.backend import PostgresLocation

if TYPE_CHECKING:
    from tests.defs.support import MadeDemo


def pytest_configure(config: pytest.Config) -> None:
    """Keep the suite off the instance `make` exports (DAGSTER_HOME=.dagster_home).

    Loading the code location stores the warehouse pool in $DAGSTER_HOME's instance
    (idem_assets/defs/pools.py): every worker would write the developer's SQLite instance at
    once. Tests that want an instance make their own under tmp_path.
    """
    os.environ.pop("DAGSTER_HOME", None)
    _read_storage_migrations_once()


def _read_storage_migrations_once() -> None:
    """Let alembic read Dagster's storage migration scripts once per worker, not per instance.

    Each `dg.materialize` without an instance makes an ephemeral one, whose storages stamp
    their schema with alembic, and alembic reads all of Dagster's ~90 revision files again each
    time it is asked: over half of a small materialize's time, in the suite's thousands of them.
    The files cannot change while the tests run, so one ScriptDirectory per location is kept;
    what is stamped, and every table Dagster creates, stays as it is.
    """
    from alembic.script import ScriptDirectory

    read = ScriptDirectory.from_config.__func__  # type: ignore[attr-defined]
    kept: dict[tuple[str | None, str | None], ScriptDirectory] = {}

    def from_config(cls: type[ScriptDirectory], config: Any) -> ScriptDirectory:
        where = (config.config_file_name, config.get_main_option("script_location"))
        if where not in kept:
            kept[where] = read(cls, config)
        return kept[where]

    ScriptDirectory.from_config = classmethod(from_config)  # type: ignore[method-assign,assignment]


#: Tests that start dagster-daemon, the webserver or Chromium run one after another in their
#: group, each group on one worker (`make test` runs four, `--dist loadgroup`): the browser tests
#: with the demo test, whose `make demo` folder they share (the `made_demo` fixture, built once
#: per worker), and the e2e tests. With the Spark group and the two modules below they are the
#: five largest units of work, so xdist hands them out first (it orders units by their number of
#: tests): the four largest start one on each worker, the fifth goes to the first worker nearly
#: done, and in-process tests fill the gaps, as the services mostly wait on ticks and polls. One
#: group for all of them was a single chain of 40 minutes that capped the whole run.
SERVICE_GROUPS = {
    "tests/browser/": "browser",
    "tests/defs/test_demo.py": "browser",
    "tests/e2e/": "e2e",
}
#: The Spark tests: tests/spark/ and the conformance cases of the Spark store. They are one group,
#: so one worker starts a Spark session and its metastore for all of them: when each of the four
#: workers took a share, four JVM sessions and four metastores started and warmed up for the
#: same 64 tests (make test-full runs them in one process too).
SPARK_GROUP = "spark"


def spark_test(nodeid: str) -> bool:
    """Whether a node id is a test of the Spark group."""
    return nodeid.startswith("tests/spark/") or (
        nodeid.startswith("tests/conformance/") and "[spark" in nodeid
    )


#: Modules whose tests share a module-scoped fixture that costs half a minute or more to build
#: (tests/test_benchmarks_smoke.py runs every benchmark at the tiny scale once, the first-hour
#: module writes `make dev-data`'s year of files): each module is one unit of work, or both
#: workers would build the fixture.
SHARED_SETUP_MODULES = ("tests/test_benchmarks_smoke.py", "tests/defs/test_first_hour.py")


class ServiceGroupScheduling(LoadGroupScheduling):
    """pytest-xdist's loadgroup, with the groups above taken from each test's path.

    An `xdist_group` mark groups nothing here: pytest-xdist 3.8 appends the group to
    `item._nodeid`, which pytest 9.2 no longer reads (its node ids live in `item._id`), so the
    marked tests were spread over both workers like any others.
    """

    def _split_scope(self, nodeid: str) -> str:
        """Return the group of a node id: its service group or module, else loadgroup's own."""
        for prefix, group in SERVICE_GROUPS.items():
            if nodeid.startswith(prefix):
                return group
        if spark_test(nodeid):
            return SPARK_GROUP
        if nodeid.startswith(SHARED_SETUP_MODULES):
            return nodeid.split("::", 1)[0]
        return super()._split_scope(nodeid)


# tryfirst: the hook takes the first scheduler returned, and pytest-xdist's own returns one.
@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> Scheduling | None:
    """Schedule `--dist loadgroup` runs with the service group; leave other modes alone."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return ServiceGroupScheduling(config, log)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL on 127.0.0.1; skipped when not installed locally, an error in CI."""
    try:
        bin_dir = find_bin_dir()
    except PostgresUnavailableError as error:
        if os.environ.get("CI"):
            pytest.fail(f"{error}; CI must run the PostgreSQL tests.")
        pytest.skip(str(error))
    server = PostgresServer.start(bin_dir)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def spark_conf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The settings of this worker's one Spark session, on a Hive metastore of its own.

    A Thrift metastore rather than an embedded Derby one, which admits a single process: the
    racing and killed writers of the Spark tests are child processes on the same catalog.
    """
    from tests.spark_session import Metastore, client_conf

    root = tmp_path_factory.getbasetemp() / "spark"
    metastore = Metastore.start(root / "metastore")
    try:
        yield client_conf(root, metastore)
    finally:
        metastore.stop()


@pytest.fixture(scope="session")
def spark(spark_conf: dict[str, str]) -> Iterator[Any]:
    """This worker's Spark session, started on first use and shared by every Spark test."""
    from idem_assets.lib.backends.spark.session import spark_session

    session = spark_session(spark_conf)
    yield session
    session.stop()


@pytest.fixture
def postgres_location(postgres_server: PostgresServer) -> PostgresLocation:
    """A fresh, empty database on the session's server, as the Postgres backend reaches it."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    postgres_server.create_database(name)
    server = postgres_server
    return PostgresLocation(server.host, server.port, server.user, name, server.password)


@pytest.fixture(scope="session")
def made_demo(tmp_path_factory: pytest.TempPathFactory) -> "MadeDemo":
    """The README's `make demo` as printed, run once per worker; tests go on from a copy_to()."""
    # Imported here: the code location loads with it, which most sessions never need.
    from tests.defs.support import run_make_demo

    return run_make_demo(tmp_path_factory.mktemp("made_demo"))

"""The one Spark session of a test process: local[2], a Derby metastore under its directory.

Spark takes its static settings from the first session of a process, so every Spark test of a
pytest worker shares this session (the ``spark`` fixture in tests/conftest.py), and the Spark
IO managers of the tests name the same settings: their ``getOrCreate`` returns it.
"""

import socket
import subprocess
import time
from pathlib import Path
from typing import Any

#: Small jobs on two shared cores: one shuffle partition, no UI, no progress bar, UTC.
FAST_CONF: dict[str, str] = {
    "spark.master": "local[2]",
    "spark.app.name": "idem-tests",
    "spark.sql.shuffle.partitions": "1",
    "spark.default.parallelism": "1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.pyspark.fallback.enabled": "false",
    "spark.sql.statistics.size.autoUpdate.enabled": "false",
    "spark.driver.memory": "1g",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    "spark.hadoop.parquet.summary.metadata.level": "NONE",
    "spark.sql.catalogImplementation": "hive",
    # Tests run many tiny queries: compiling each to Java costs more than it saves.
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.adaptive.enabled": "false",
}


def test_conf(root: Path) -> dict[str, str]:
    """FAST_CONF with the warehouse, a Derby metastore and Spark's scratch files under ``root``."""
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    java = (
        f"-Dderby.system.home={root} -Djava.io.tmpdir={root}"
        # A test JVM lives minutes: the quick compiler only, and a small serial heap.
        " -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    )
    return {
        **FAST_CONF,
        "spark.sql.warehouse.dir": str(root / "warehouse"),
        "spark.hadoop.javax.jdo.option.ConnectionURL": (
            f"jdbc:derby:;databaseName={root / 'metastore_db'};create=true"
        ),
        "spark.driver.extraJavaOptions": java,
        "spark.local.dir": str(root / "local"),
    }


def jars() -> str:
    """The pyspark wheel's jars: a Hive metastore server needs nothing else."""
    import pyspark

    return str(Path(pyspark.__file__).parent / "jars")


class Metastore:
    """A standalone Hive metastore (Thrift) with Derby inside, from the pyspark wheel's jars.

    It is what a cluster's Spark drivers share: with it, a test's child processes open their
    own sessions on the same catalog (an embedded Derby admits one process).
    """

    def __init__(self, root: Path, port: int, process: "subprocess.Popen[bytes]") -> None:
        self.root, self.port, self.process = root, port, process

    @property
    def uri(self) -> str:
        """``thrift://127.0.0.1:<port>``."""
        return f"thrift://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, root: Path) -> "Metastore":
        """Start one on a free port and wait until it answers."""
        from tests.ports import start_on_a_free_port

        return start_on_a_free_port(lambda port: cls._start(root.resolve(), port))

    @classmethod
    def _start(cls, root: Path, port: int) -> "Metastore":
        from tests.ports import PortTakenError, bind_failed

        root.mkdir(parents=True, exist_ok=True)
        derby = f"jdbc:derby:;databaseName={root / 'metastore_db'};create=true"
        command = [
            "java",
            "-Xmx384m",
            "-XX:TieredStopAtLevel=1",
            "-XX:+UseSerialGC",
            "-cp",
            f"{jars()}/*",
            f"-Dderby.system.home={root}",
            # Hive's log4j2 defaults ask for async loggers, whose jar the wheel lacks.
            "-Dlog4j2.contextSelector=org.apache.logging.log4j.core.selector.ClassLoaderContextSelector",
            f"-Djavax.jdo.option.ConnectionURL={derby}",
            "-Ddatanucleus.schema.autoCreateAll=true",
            "-Dhive.metastore.schema.verification=false",
            f"-Dhive.metastore.warehouse.dir={root / 'warehouse'}",
            "org.apache.hadoop.hive.metastore.HiveMetaStore",
            "-p",
            str(port),
        ]
        log = root / f"metastore-{port}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=root)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if process.poll() is not None:
                text = log.read_text(errors="replace")
                if bind_failed(text):
                    raise PortTakenError(text[-500:])
                raise RuntimeError(f"the Hive metastore exited: {text[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return cls(root, port, process)
            except OSError:
                time.sleep(0.5)
        process.kill()
        raise RuntimeError(f"the Hive metastore did not answer within 240 s: see {log}")

    def stop(self) -> None:
        """Stop the server."""
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()


def client_conf(root: Path, metastore: Metastore) -> dict[str, str]:
    """:func:`test_conf` for a session of ``metastore`` (no Derby in the process)."""
    conf = test_conf(root)
    del conf["spark.hadoop.javax.jdo.option.ConnectionURL"]
    conf["spark.hadoop.hive.metastore.uris"] = metastore.uri
    return conf


def drop_schema(spark: Any, name: str) -> None:
    """Drop every table of schema ``name``; the schema itself stays, empty.

    A metastore server from the pyspark wheel cannot drop a schema: its drop listener opens a
    BoneCP connection pool, whose jar the wheel lacks (``NoSuchObjectException`` reaches the
    client). Dropping tables needs no pool.
    """
    if not spark.catalog.databaseExists(name):
        return
    for table in spark.catalog.listTables(name):
        if not table.isTemporary:
            spark.sql(f"DROP TABLE IF EXISTS `{name}`.`{table.name}`")

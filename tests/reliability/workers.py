"""Code that runs in child processes: publishes that get killed, and writers that race.

Children come from a forkserver that has already imported DuckDB, Arrow and idem_assets, so
starting one costs milliseconds, not the second or two it takes to import Dagster.
"""

import multiprocessing
import multiprocessing.connection
import os
import signal
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa

import idem_assets as ia
from idem_assets.lib.backends.duckdb.backend import table_columns

from .support import NOW, settings, window

_CONTEXT: Any = None
#: The engines' modules, which a racing or killed writer of each engine imports: about a
#: second of CPU per child for Iceberg's, less for the others'. None of them starts a thread
#: or opens a connection when imported, so a fork after them is safe.
BACKENDS = [
    f"idem_assets.lib.backends.{engine}.backend" for engine in ("delta", "iceberg", "postgres")
]


def context() -> Any:
    """The forkserver multiprocessing context, with this module preloaded in the server."""
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        # Modules on the interpreter's own path: Python 3.11's forkserver ignores the parent's
        # sys.path when it preloads, so this test package itself is imported by each child.
        _CONTEXT.set_forkserver_preload(["idem_assets", "dagster_duckdb", "pytest", *BACKENDS])
    return _CONTEXT


@dataclass
class Child:
    """A publishing child process and the steps it has reported so far."""

    process: Any
    reader: Any
    steps: list[str] = field(default_factory=list)

    def wait_for(self, step: str | None, timeout: float) -> bool:
        """Collect steps until ``step`` arrives (``None``: until ``timeout``); False on timeout."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            if not self.reader.poll(remaining):
                break
            try:
                self.steps.append(self.reader.recv_bytes().decode())
            except EOFError:
                return False
            if step is not None and self.steps[-1] == step:
                return True
        return False

    def kill(self) -> None:
        """SIGKILL the child, then collect every step it reported before it died."""
        if self.process.is_alive():
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.join(30)
        try:
            while self.reader.poll(0):
                self.steps.append(self.reader.recv_bytes().decode())
        except EOFError:
            pass
        self.reader.close()


def write_batch(path: str, batch: pa.Table) -> None:
    """Write ``batch`` as an Arrow IPC file a child can map without parsing."""
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_table(batch)


def read_batch(path: str) -> pa.Table:
    """Read a batch written by :func:`write_batch`."""
    with pa.memory_map(path) as source:
        return pa.ipc.open_file(source).read_all()


def publish_until_killed(
    db: str,
    batch_path: str,
    mode: str,
    metadata: dict[str, Any],
    keys: Sequence[str],
    table: str,
    checkpoint_threshold: str,
    report: multiprocessing.connection.Connection,
    streamed: bool = False,
) -> None:
    """Publish one batch, reporting every step on ``report``, then wait to be killed.

    The messages are ``start``, the four ``on_stage`` points, ``committed`` when publish()
    returned, and ``closed`` after close() (which checkpoints the WAL into the file).
    ``streamed``: the batch goes as a RecordBatchReader, and ``staged in its table`` (or
    ``staged apart``) says where it was staged.
    """
    batch = read_batch(batch_path)
    write_settings = settings(mode, metadata, table=table)
    write_window = window(*keys)
    report.send_bytes(b"start")

    def progress(message: str) -> None:
        if message.startswith("Staged "):
            where = "in its table" if message.endswith(" itself).") else "apart"
            report.send_bytes(f"staged {where}".encode())

    conn = duckdb.connect(db, config={"checkpoint_threshold": checkpoint_threshold})
    ia.publish(
        conn,
        batch.to_reader(max_chunksize=2_000) if streamed else batch,
        write_settings,
        write_window,
        now=NOW,
        on_stage=lambda stage: report.send_bytes(stage.encode()),
        progress=progress,
    )
    report.send_bytes(b"committed")
    conn.close()
    report.send_bytes(b"closed")
    time.sleep(120)


def race_publish(
    db: str,
    batch_path: str,
    mode: str,
    keys: Sequence[str],
    start_at: float,
    hold_at: str | None,
    hold_s: float,
    retry: bool,
    report: multiprocessing.connection.Connection,
) -> None:
    """Open the file at ``start_at`` and publish; report ``ok`` or the error, class and message.

    ``hold_at`` pauses inside the transaction at that stage, so another process is sure to find
    the file locked. ``retry`` opens the file the way the IO managers do (DuckDBResource retries
    while another process holds the lock); otherwise one plain ``duckdb.connect``.
    """
    batch = read_batch(batch_path)
    write_settings = settings(mode)
    write_window = window(*keys)

    def hold(stage: str) -> None:
        if stage == "guards_passed":
            report.send(("locked", "", ""))
        if stage == hold_at:
            time.sleep(hold_s)

    time.sleep(max(0.0, start_at - time.time()))
    try:
        if retry:
            from dagster_duckdb import DuckDBResource

            with DuckDBResource(database=db).get_connection() as conn:
                ia.publish(conn, batch, write_settings, write_window, now=NOW, on_stage=hold)
        else:
            conn = duckdb.connect(db)
            try:
                ia.publish(conn, batch, write_settings, write_window, now=NOW, on_stage=hold)
            finally:
                conn.close()
        report.send(("ok", "", ""))
    except Exception as exc:
        report.send(("error", type(exc).__name__, str(exc)))
    finally:
        report.close()


def open_and_read(db: str, read_only: bool, report: multiprocessing.connection.Connection) -> None:
    """Open ``db`` (read-only or not) and count the trips; report the count or the error."""
    try:
        conn = duckdb.connect(db, read_only=read_only)
        try:
            if table_columns(conn, "main", "trips") is None:
                report.send(("ok", -1, ""))
            else:
                n = conn.execute("SELECT count(*) FROM main.trips").fetchall()[0][0]
                report.send(("ok", n, ""))
        finally:
            conn.close()
    except Exception as exc:
        report.send(("error", type(exc).__name__, str(exc)))
    except BaseException:
        report.send(("error", "BaseException", traceback.format_exc()))
    finally:
        report.close()


def hold_open(
    db: str, read_only: bool, hold_s: float, report: multiprocessing.connection.Connection
) -> None:
    """Hold ``db`` open for ``hold_s`` seconds (a notebook or BI tool left open)."""
    conn = duckdb.connect(db, read_only=read_only)
    report.send_bytes(b"open")
    time.sleep(hold_s)
    conn.close()
    report.send_bytes(b"closed")

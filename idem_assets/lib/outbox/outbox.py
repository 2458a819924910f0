"""Side effects a rerun does not repeat: external actions keyed by the content they carry.

Replacing a table makes a rerun harmless for readers, but an email, a webhook or a file export has
already left the building. :class:`Outbox` performs each such action once per content: the action
is keyed by asset, partition, action name and the fingerprint of the content, and recorded in a
ledger (a small SQLite file) only after it succeeded. A rerun with the same content skips the
action and says so in the run log; a correction that changes the content performs it again as a
new revision that names the one it supersedes.

The guarantee is at least once, never silently zero: a crash between the action and the ledger
write leaves the attempt marked ``pending``, and the next run performs it again with the *same*
idempotency key, which the receiver uses to drop the duplicate.
"""

import hashlib
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import dagster as dg
import duckdb
import pyarrow as pa
from pydantic import Field

from idem_assets.lib.model.errors import ConfigurationError

#: The points a delivery passes, in order; ``on_stage`` is called at each.
OUTBOX_STAGES = ("claimed", "performed", "recorded")

#: An ``on_stage`` hook for every delivery in this context that passes none (crash injection).
OUTBOX_STAGE_HOOK: ContextVar[Callable[[str], None] | None] = ContextVar(
    "idem_outbox_stage_hook", default=None
)

Outcome = Literal["performed", "retried", "skipped"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox_deliveries (
    asset TEXT NOT NULL,
    partition_key TEXT NOT NULL,
    action TEXT NOT NULL,
    revision INTEGER NOT NULL,
    fingerprint TEXT NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE,
    supersedes TEXT,
    status TEXT NOT NULL CHECK (status IN ('pending', 'delivered')),
    attempts INTEGER NOT NULL,
    run_id TEXT,
    claimed_at TEXT NOT NULL,
    delivered_at TEXT,
    PRIMARY KEY (asset, partition_key, action, revision)
)
"""


def content_fingerprint(table: pa.Table) -> str:
    """Order-independent fingerprint of rows (count and sum of row hashes), as the tables' own."""
    names = sorted(table.column_names)
    # Positional names: the frame's own column names need not be SQL identifiers.
    renamed = table.select(names).rename_columns([f"c{i}" for i in range(len(names))])
    con = duckdb.connect()
    try:
        con.register("content", renamed)
        cols = ", ".join(f"c{i}" for i in range(len(names))) or "NULL"
        count, digest = con.execute(
            f"SELECT count(*), coalesce(sum(hash({cols})::HUGEINT), 0) FROM content"
        ).fetchall()[0]
    finally:
        con.close()
    return f"{count}:{int(digest) % (1 << 128):032x}"


def idempotency_key(
    asset: str, partition: str, action: str, revision: int, fingerprint: str
) -> str:
    """The key a receiver deduplicates on: the same for every attempt of one revision."""
    text = "\x1f".join([asset, partition, action, str(revision), fingerprint])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Delivery:
    """One revision of one action: what ``send`` receives and passes on to the receiver."""

    asset: str
    partition: str
    action: str
    revision: int
    fingerprint: str
    #: Pass it to the receiver (an ``Idempotency-Key`` header, a file name): every attempt of
    #: this revision carries the same key, so the receiver can drop a repeat.
    key: str
    #: Key of the revision this one corrects, so the receiver can replace instead of add.
    supersedes: str | None


@dataclass(frozen=True)
class DeliveryRecord:
    """A row of the ledger."""

    delivery: Delivery
    status: Literal["pending", "delivered"]
    attempts: int
    run_id: str | None


@dataclass(frozen=True)
class DeliveryResult:
    """What :meth:`Outbox.deliver` did: performed, retried (same key) or skipped."""

    outcome: Outcome
    delivery: Delivery

    @property
    def metadata(self) -> dict[str, str | int]:
        """Materialization metadata naming the outcome and the key."""
        return {
            "outbox_outcome": self.outcome,
            "outbox_key": self.delivery.key,
            "outbox_revision": self.delivery.revision,
            "outbox_fingerprint": self.delivery.fingerprint,
        }


class Outbox(dg.ConfigurableResource):
    """Performs an asset's external actions once per content, recorded in a SQLite ledger."""

    ledger: str = Field(
        description=(
            "Path of the SQLite ledger file (created on first use). Keep it apart from the"
            " warehouse: rebuilding the warehouse must not resend every report."
        ),
    )

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        Path(self.ledger).parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode: transactions are opened explicitly with BEGIN IMMEDIATE.
        with closing(sqlite3.connect(self.ledger, timeout=60, isolation_level=None)) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(_SCHEMA)
            yield conn

    def deliver(
        self,
        context: dg.AssetExecutionContext | dg.OpExecutionContext,
        action: str,
        content: pa.Table | str,
        send: Callable[[Delivery], object],
        *,
        partition: str | None = None,
        on_stage: Callable[[str], None] | None = None,
    ) -> DeliveryResult:
        """Perform ``send`` unless this content was already delivered for the partition.

        ``content`` is the table the action carries (or its fingerprint). ``partition`` defaults
        to the run's partition key; a range run delivers once per partition, so it must name one.
        ``on_stage`` is a test hook called at ``"claimed"``, ``"performed"`` and ``"recorded"``.
        """
        asset = context.asset_key.to_user_string()
        part = self._partition(context, asset, action, partition)
        fingerprint = content if isinstance(content, str) else content_fingerprint(content)
        stage = on_stage or OUTBOX_STAGE_HOOK.get() or _no_stage
        with self._connect() as conn:
            run_id = context.run.run_id
            outcome, delivery = self._claim(conn, asset, part, action, fingerprint, run_id)
            where = f"{action} of asset '{asset}', partition {part or '(unpartitioned)'}"
            if outcome == "skipped":
                context.log.info(
                    f"Outbox: skipped {where}: revision {delivery.revision} (key {delivery.key})"
                    f" already delivered this content (fingerprint {fingerprint}); a rerun with"
                    " the same content does not repeat it."
                )
                return DeliveryResult("skipped", delivery)
            if outcome == "retried":
                context.log.warning(
                    f"Outbox: {where}, revision {delivery.revision} (key {delivery.key}) was"
                    " started before but never recorded as delivered (a crash between the action"
                    " and the ledger write?). Performing it again with the same key, so the"
                    " receiver can drop it if it already arrived."
                )
            stage("claimed")
            try:
                send(delivery)
            except Exception as exc:
                exc.add_note(
                    f"Outbox: {where}, revision {delivery.revision} stays pending; the next run"
                    f" performs it again with the same key {delivery.key}, so the receiver can"
                    " drop it if this attempt got through."
                )
                raise
            stage("performed")
            conn.execute(
                "UPDATE outbox_deliveries SET status = 'delivered', delivered_at = ?"
                " WHERE idempotency_key = ?",
                [_now(), delivery.key],
            )
            stage("recorded")
        verb = "corrected" if delivery.supersedes else "performed"
        context.log.info(
            f"Outbox: {verb} {where}: revision {delivery.revision}, key {delivery.key},"
            f" fingerprint {fingerprint}"
            + (f", supersedes {delivery.supersedes}" if delivery.supersedes else "")
            + "."
        )
        return DeliveryResult(outcome, delivery)

    def records(self) -> list[DeliveryRecord]:
        """Every ledger row, oldest first."""
        if not Path(self.ledger).exists():
            return []
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT asset, partition_key, action, revision, fingerprint, idempotency_key,"
                " supersedes, status, attempts, run_id FROM outbox_deliveries"
                " ORDER BY claimed_at, asset, partition_key, action, revision"
            ).fetchall()
        return [
            DeliveryRecord(Delivery(*row[:7]), status=row[7], attempts=row[8], run_id=row[9])
            for row in rows
        ]

    def _partition(
        self,
        context: dg.AssetExecutionContext | dg.OpExecutionContext,
        asset: str,
        action: str,
        partition: str | None,
    ) -> str:
        if partition is not None:
            return partition
        if context.has_partition_key_range and len(context.partition_keys) > 1:
            raise ConfigurationError(
                f"Outbox: asset '{asset}' runs partitions {context.partition_keys[0]}..."
                f"{context.partition_keys[-1]} in one run, so '{action}' needs the partition it"
                " belongs to. Fix: deliver once per partition, e.g. for key in"
                " context.partition_keys: outbox.deliver(context, ..., partition=key)."
            )
        return context.partition_key if context.has_partition_key else ""

    def _claim(
        self,
        conn: sqlite3.Connection,
        asset: str,
        partition: str,
        action: str,
        fingerprint: str,
        run_id: str,
    ) -> tuple[Outcome, Delivery]:
        # IMMEDIATE takes the write lock before reading, so two runs cannot claim one revision.
        conn.execute("BEGIN IMMEDIATE")
        try:
            latest = conn.execute(
                "SELECT revision, fingerprint, idempotency_key, supersedes, status"
                " FROM outbox_deliveries WHERE asset = ? AND partition_key = ? AND action = ?"
                " ORDER BY revision DESC LIMIT 1",
                [asset, partition, action],
            ).fetchall()
            if latest and latest[0][1] == fingerprint:
                revision, _, key, supersedes, status = latest[0]
                delivery = Delivery(
                    asset, partition, action, revision, fingerprint, key, supersedes
                )
                if status == "delivered":
                    conn.execute("COMMIT")
                    return "skipped", delivery
                conn.execute(
                    "UPDATE outbox_deliveries SET attempts = attempts + 1, run_id = ?"
                    " WHERE idempotency_key = ?",
                    [run_id, key],
                )
                conn.execute("COMMIT")
                return "retried", delivery
            # New content (or content that returns to an earlier version): a new revision with
            # a new key, naming the latest one, delivered or not, as the one it supersedes.
            revision = latest[0][0] + 1 if latest else 1
            supersedes = latest[0][2] if latest else None
            key = idempotency_key(asset, partition, action, revision, fingerprint)
            conn.execute(
                "INSERT INTO outbox_deliveries (asset, partition_key, action, revision,"
                " fingerprint, idempotency_key, supersedes, status, attempts, run_id, claimed_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', 1, ?, ?)",
                [asset, partition, action, revision, fingerprint, key, supersedes, run_id, _now()],
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return "performed", Delivery(
            asset, partition, action, revision, fingerprint, key, supersedes
        )


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _no_stage(stage: str) -> None:
    pass

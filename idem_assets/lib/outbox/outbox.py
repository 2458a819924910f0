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

import fcntl
import hashlib
import os
import shlex
import sqlite3
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import dagster as dg
from pydantic import Field

from idem_assets.lib.dagster_layer.plan import is_plan
from idem_assets.lib.model.errors import ConfigurationError, OutboxError
from idem_assets.lib.outbox.content import fingerprints_of

#: The points a delivery passes, in order; ``on_stage`` is called at each.
OUTBOX_STAGES = ("claimed", "performed", "recorded")

#: An ``on_stage`` hook for every delivery in this context that passes none (crash injection).
OUTBOX_STAGE_HOOK: ContextVar[Callable[[str], None] | None] = ContextVar(
    "idem_outbox_stage_hook", default=None
)

#: True while an action's ``send`` runs, so a watcher of side effects can tell the outbox's own
#: deliveries from the ones that bypass it (``idem_assets.testing`` reads it).
OUTBOX_SENDING: ContextVar[bool] = ContextVar("idem_outbox_sending", default=False)

#: A plan run's deliveries are only ``"would deliver"`` or ``"would skip"``: nothing is sent.
Outcome = Literal["performed", "retried", "skipped", "would deliver", "would skip"]

#: The Dagster instance remembers each ledger it saw in use (a daemon cursor, keyed by path), so
#: a ledger that vanishes is refused instead of silently starting every revision again at 1.
_LEDGER_SEEN = "idem_assets/outbox_ledger_seen:"
#: What starting an empty ledger means for the deliveries the old one recorded.
_STARTING_AGAIN = (
    "every partition then performs its actions again as revision 1; content that did not"
    " change gets the same key as before, so a receiver that drops repeated keys drops it,"
    " but an e-mail is sent again"
)

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
    lock_timeout: float = Field(
        default=10.0,
        description=(
            "Seconds to wait for another connection's write lock on the ledger before refusing"
            " to deliver. A claim holds the lock for milliseconds, so a longer wait means a"
            " transaction left open."
        ),
    )

    @contextmanager
    def _connect(self, where: str, sent: bool = False) -> Iterator[sqlite3.Connection]:
        """The ledger, open; any failure of it as an :class:`OutboxError` with its fix."""
        path = Path(self.ledger)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Autocommit mode: transactions are opened explicitly with BEGIN IMMEDIATE.
            connection = sqlite3.connect(path, timeout=self.lock_timeout, isolation_level=None)
            with closing(connection) as conn:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute(_SCHEMA)
                yield conn
        except (sqlite3.Error, OSError) as exc:
            raise OutboxError(_ledger_failure(path, where, exc, sent, self.lock_timeout)) from exc

    def deliver(
        self,
        context: dg.AssetExecutionContext | dg.OpExecutionContext,
        action: str,
        content: Any,
        send: Callable[[Delivery], object],
        *,
        partition: str | None = None,
        on_stage: Callable[[str], None] | None = None,
    ) -> DeliveryResult:
        """Perform ``send`` unless this content was already delivered for the partition.

        ``content`` is what the action carries: a table (pyarrow, pandas or Polars), text or
        bytes, JSON-like data, or a fingerprint from :func:`content_fingerprint`; the ledger
        keeps only its fingerprint. ``partition`` defaults to the run's partition key; a range
        run delivers once per partition, so it must name one of the run's partitions.
        ``on_stage`` is a test hook called at ``"claimed"``, ``"performed"`` and ``"recorded"``.
        """
        asset = context.asset_key.to_user_string()
        part = self._partition(context, asset, action, partition)
        fingerprint, earlier = fingerprints_of(content)
        stage = on_stage or OUTBOX_STAGE_HOOK.get() or _no_stage
        where = f"{action} of asset '{asset}', partition {part or '(unpartitioned)'}"
        if is_plan(context.run.tags):
            return self._planned(context, where, asset, part, action, (fingerprint, *earlier))
        started = self._known_ledger(context.instance, where)
        with self._connect(where) as conn:
            run_id = context.run.run_id
            outcome, delivery = self._claim(
                conn, asset, part, action, (fingerprint, *earlier), run_id
            )
        if started:
            context.log.info(f"Outbox: started a new ledger {self.ledger}.")
        if outcome == "skipped":
            context.log.info(
                f"Outbox: skipped {where}: revision {delivery.revision} (key {delivery.key})"
                f" already delivered this content (fingerprint {delivery.fingerprint}); a rerun"
                " with the same content does not repeat it."
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
        token = OUTBOX_SENDING.set(True)
        try:
            send(delivery)
        except Exception as exc:
            exc.add_note(
                f"Outbox: {where}, revision {delivery.revision} stays pending; the next run"
                f" performs it again with the same key {delivery.key}, so the receiver can"
                " drop it if this attempt got through."
            )
            raise
        finally:
            OUTBOX_SENDING.reset(token)
        stage("performed")
        with self._connect(where, sent=True) as conn:
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

    def _planned(
        self,
        context: dg.AssetExecutionContext | dg.OpExecutionContext,
        where: str,
        asset: str,
        partition: str,
        action: str,
        fingerprints: Sequence[str],
    ) -> DeliveryResult:
        """What a delivery would do, read from the ledger without claiming or sending anything."""
        path = Path(self.ledger)
        latest: list[tuple[Any, ...]] = []
        if path.exists():
            # Read-only: a plan neither creates the ledger nor takes its write lock.
            with closing(sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)) as conn:
                latest = _latest(conn, asset, partition, action)
        if latest and latest[0][1] in fingerprints and latest[0][4] == "delivered":
            revision, recorded, key, supersedes, _ = latest[0]
            delivery = Delivery(asset, partition, action, revision, recorded, key, supersedes)
            context.log.info(
                f"Outbox (plan): would skip {where}: revision {revision} already delivered this"
                " content."
            )
            return DeliveryResult("would skip", delivery)
        if latest and latest[0][1] in fingerprints:
            revision, recorded, key, supersedes, _ = latest[0]
        else:
            revision = latest[0][0] + 1 if latest else 1
            supersedes = latest[0][2] if latest else None
            recorded = fingerprints[0]
            key = idempotency_key(asset, partition, action, revision, recorded)
        delivery = Delivery(asset, partition, action, revision, recorded, key, supersedes)
        context.log.info(
            f"Outbox (plan): would deliver {where}: revision {revision}, key {key}"
            + (f", superseding {supersedes}" if supersedes else "")
            + ". Nothing was sent."
        )
        return DeliveryResult("would deliver", delivery)

    def records(self) -> list[DeliveryRecord]:
        """Every ledger row, oldest first."""
        if not Path(self.ledger).exists():
            return []
        with self._connect("the outbox's records") as conn:
            rows = conn.execute(
                "SELECT asset, partition_key, action, revision, fingerprint, idempotency_key,"
                " supersedes, status, attempts, run_id FROM outbox_deliveries"
                " ORDER BY claimed_at, asset, partition_key, action, revision"
            ).fetchall()
        return [
            DeliveryRecord(Delivery(*row[:7]), status=row[7], attempts=row[8], run_id=row[9])
            for row in rows
        ]

    def _known_ledger(self, instance: dg.DagsterInstance, where: str) -> bool:
        """Refuse a ledger the instance saw in use that is gone; ``True`` when it starts now."""
        path = Path(self.ledger).absolute()
        mark = _LEDGER_SEEN + str(path)
        seen = instance.run_storage.get_cursor_values({mark}).get(mark)
        exists = path.exists()
        if seen and not exists:
            quoted = shlex.quote(str(path))
            raise OutboxError(
                f"Refused to deliver {where}: its ledger {path} is gone, though this Dagster"
                f" instance saw it in use (first on {seen[:10]}). Without it the outbox cannot"
                " tell what was delivered: every partition would perform its actions again as"
                " revision 1, and a correction would not name the revision it supersedes."
                " Nothing was sent. Fix: restore the ledger from a backup to that path; or, to"
                f" start an empty ledger knowingly ({_STARTING_AGAIN}): mkdir -p"
                f" {shlex.quote(str(path.parent))} && touch {quoted}"
            )
        if not seen:
            instance.run_storage.set_cursor_values({mark: _now()})
        return not exists

    def _partition(
        self,
        context: dg.AssetExecutionContext | dg.OpExecutionContext,
        asset: str,
        action: str,
        partition: str | None,
    ) -> str:
        if partition is not None:
            return _own_partition(context, asset, action, partition)
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
        fingerprints: Sequence[str],
        run_id: str,
    ) -> tuple[Outcome, Delivery]:
        """Claim the content's revision; ``fingerprints``: its own first, then earlier forms."""
        fingerprint = fingerprints[0]
        # IMMEDIATE takes the write lock before reading, so two runs cannot claim one revision.
        conn.execute("BEGIN IMMEDIATE")
        try:
            latest = _latest(conn, asset, partition, action)
            if latest and latest[0][1] in fingerprints:
                # The revision keeps the fingerprint its key was made of.
                revision, recorded, key, supersedes, status = latest[0]
                delivery = Delivery(asset, partition, action, revision, recorded, key, supersedes)
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


def _latest(
    conn: sqlite3.Connection, asset: str, partition: str, action: str
) -> list[tuple[Any, ...]]:
    """The latest revision of an action: ``(revision, fingerprint, key, supersedes, status)``."""
    return conn.execute(
        "SELECT revision, fingerprint, idempotency_key, supersedes, status"
        " FROM outbox_deliveries WHERE asset = ? AND partition_key = ? AND action = ?"
        " ORDER BY revision DESC LIMIT 1",
        [asset, partition, action],
    ).fetchall()


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _no_stage(stage: str) -> None:
    pass


def _own_partition(
    context: dg.AssetExecutionContext | dg.OpExecutionContext,
    asset: str,
    action: str,
    partition: str,
) -> str:
    """``partition`` spelt as Dagster spells the key, refused unless the run materialises it."""
    partitioned = context.has_partition_key or context.has_partition_key_range
    owned = list(context.partition_keys) if partitioned else []
    if not owned:
        raise ConfigurationError(
            f"Outbox: asset '{asset}' is not partitioned, so '{action}' has no partition"
            f" {partition!r} to belong to. Nothing was sent. Fix: leave partition= out, and"
            " name each of its deliveries in the action instead, e.g."
            f" outbox.deliver(context, '{action}_{partition}', ...)."
        )
    partitions_def = context.assets_def.partitions_def
    key = _dagster_key(partitions_def, partition) if partitions_def else partition
    if key in owned:
        return key
    shown = ", ".join(owned[:5]) + (f", ... ({len(owned)} in all)" if len(owned) > 5 else "")
    raise ConfigurationError(
        f"Outbox: asset '{asset}' delivers '{action}' for partition {partition!r}, which this"
        f" run does not materialise (it runs {shown}). Its rerun would not see this delivery,"
        " and a run of that partition would send the same content again under its own key."
        f" Nothing was sent. Fix: deliver from the run of {partition!r}, or pass one of this"
        f" run's partitions, e.g. partition=context.partition_keys[0] ({owned[0]!r})."
    )


def _dagster_key(partitions_def: dg.PartitionsDefinition, key: str) -> str:
    """The key as its definition spells it (``2026-1-2`` is ``2026-01-02``); as given if none."""
    if isinstance(partitions_def, dg.TimeWindowPartitionsDefinition):
        try:
            start = partitions_def.time_window_for_partition_key(key).start
            return partitions_def.get_partition_key_for_timestamp(start.timestamp())
        except Exception:  # Dagster raises ValueError or CheckError for an unparsable key.
            return key
    if isinstance(partitions_def, dg.MultiPartitionsDefinition):
        try:
            by_dimension = partitions_def.get_partition_key_from_str(key).keys_by_dimension
        except Exception:
            return key
        return str(
            dg.MultiPartitionKey(
                {
                    d.name: _dagster_key(d.partitions_def, by_dimension[d.name])
                    for d in partitions_def.partitions_defs
                }
            )
        )
    return key


def _ledger_failure(path: Path, where: str, exc: Exception, sent: bool, lock_timeout: float) -> str:
    """What went wrong with the ledger, what it means for the delivery, and the fix."""
    name = getattr(exc, "sqlite_errorname", "")
    quoted = shlex.quote(str(path))
    if name == "SQLITE_BUSY" or "locked" in str(exc):
        what = (
            f"the ledger {path} stayed locked by another connection for {lock_timeout:g} s (a"
            " transaction left open: a delivery that hangs in another process, an open sqlite3"
            " shell, a backup)"
        )
        fix = (
            "end the other connection's transaction (commit or close it), then rerun this"
            " partition; or raise Outbox(lock_timeout=...) if deliveries really queue that long."
        )
    elif name in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
        what = (
            f"the ledger {path} is not a readable SQLite database ({exc}): corrupt, or another"
            " file at that path"
        )
        fix = (
            f"restore it from a backup; or set it aside and start an empty ledger knowingly"
            f" ({_STARTING_AGAIN}): mv {quoted} {shlex.quote(str(path) + '.corrupt')}"
            f" && touch {quoted}"
        )
    elif name in ("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM") or isinstance(
        exc, PermissionError
    ):
        what = f"the ledger {path} cannot be written ({exc})"
        fix = _write_fix(path)
    else:
        what = f"the ledger {path} failed ({type(exc).__name__}: {exc})"
        fix = "repair or restore the ledger file, then rerun this partition."
    if sent:
        return (
            f"Outbox: {where} was performed, but {what}, so it could not be recorded. It stays"
            " pending: the next run performs it again with the same key, so the receiver can"
            f" drop it. Fix: {fix}"
        )
    # No full stop after the fix: it may end in a command, to be run as printed.
    return f"Refused to deliver {where}: {what}. Nothing was sent. Fix: {fix}"


def _write_fix(path: Path) -> str:
    """The command that makes the ledger, and the folder its journal files go in, writable."""
    # SQLite keeps <ledger>-wal and <ledger>-shm next to the file, so the folder must be writable.
    places = [p for p in (path, path.parent) if p.exists()]
    if any(os.statvfs(p).f_flag & os.ST_RDONLY for p in places):
        return "point Outbox(ledger=...) at a writable volume: this one is mounted read-only."
    pinned = [p for p in places if _immutable(p)]
    if pinned:
        return "chattr -i " + " ".join(shlex.quote(str(p)) for p in pinned)
    blocked = [p for p in places if not os.access(p, os.W_OK)]
    if blocked:
        return "chmod u+w " + " ".join(shlex.quote(str(p)) for p in blocked)
    return "give the user running Dagster write access to the ledger and its folder."


def _immutable(path: Path) -> bool:
    """Whether ``path`` has Linux's immutable flag (chattr +i), which even root cannot write."""
    get_flags, immutable = 0x80086601, 0x10  # FS_IOC_GETFLAGS, FS_IMMUTABLE_FL
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        flags = fcntl.ioctl(fd, get_flags, b"\0" * 8)
        return bool(int.from_bytes(flags[:4], sys.byteorder) & immutable)
    except OSError:
        return False
    finally:
        os.close(fd)

"""What a failed delta-rs call means: a commit another writer won, or a cause to name.

delta-rs raises one ``CommitFailedError`` both for a commit that lost to a concurrent writer and
for a table that can never take the commit (an append-only table, a feature it cannot write), so
the publish tells them apart by delta-rs's own messages: only a lost commit is worth deciding
again on the new version (:func:`lost_commit`). The others it knows are explained: a log it
cannot read (:func:`log_damage`), storage it may not write (:func:`denied`), rows a table's
constraint refused (:func:`refused_rows`); anything else is raised as delta-rs raised it.
"""

import json
import os
import re
from collections.abc import Mapping, Sequence

from idem_assets.lib.model.errors import ConstraintViolationError, StorageError

#: delta-rs's messages for a commit that lost to another writer's: its conflict checker's
#: verdicts, no attempts left, or (creating a table) a table that exists by the time it writes.
_LOST = re.compile(
    r"Commit failed: a concurrent transaction"
    r"|Metadata changed since last commit"
    r"|Concurrent transaction failed"
    r"|Protocol changed since last commit"
    r"|^Failed to commit transaction: \d+$"
    r"|A table already exists at: "
)
#: delta-rs's messages for a log it cannot read.
_LOG = re.compile(
    r"Json error|Invalid JSON|Expected contiguous commit files|No table metadata or protocol"
    r" found"
)
#: The operating system's refusals to write (EPERM, EACCES, EROFS), as delta-rs reports them.
_DENIED = re.compile(r"\(os error (1|13|30)\)|Os \{ code: (1|13|30),")
_REASONS = {
    "1": "operation not permitted",
    "13": "permission denied",
    "30": "read-only file system",
}
_DENIED_PATH = re.compile(
    r"(?:Unable to (?:open file|create dir|create file|copy file|rename)|Could not create local"
    r" directory:) (/[^\s#:]+)"
)
_REFUSED_ROWS = re.compile(r"Invalid data found: (\d+) rows failed validation check")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def lost_commit(exc: BaseException) -> str | None:
    """The first line of ``exc`` when it says another writer committed first, else ``None``."""
    first = plain(exc).split("\n")[0]
    return first if _LOST.search(first) else None


def plain(exc: BaseException) -> str:
    """delta-rs's message without its colours, arrows and Rust backtrace."""
    text = _ANSI.sub("", str(exc)).replace("↳", "")
    lines = [line.strip() for line in text.strip().splitlines()]
    # A backtrace starts at a numbered frame ("0: <unknown>").
    kept = []
    for line in lines:
        if re.match(r"\d+: ", line):
            break
        if line:
            kept.append(line)
    return ": ".join(kept)


def refused_rows(
    exc: BaseException,
    where: str,
    uri: str,
    checks: Mapping[str, str],
    not_null: Sequence[str],
) -> ConstraintViolationError | None:
    """The error naming the table's constraints, if ``exc`` is delta-rs refusing rows for them.

    delta-rs checks every CHECK constraint and NOT NULL column at once and says only how many
    rows failed, so all of them are named, with its preview of the rows.
    """
    found = _REFUSED_ROWS.search(str(exc))
    if found is None:
        return None
    declared = [f"CHECK {name} ({expression})" for name, expression in checks.items()]
    declared += [f"NOT NULL {column}" for column in not_null]
    table = f"deltalake.DeltaTable({uri!r})"
    drops = [f"{table}.alter.drop_constraint({name!r})" for name in checks]
    drops += [f"{table}.alter.drop_column_not_null({column!r})" for column in not_null]
    return ConstraintViolationError(
        f"Refused to write {where}: {found[1]} row(s) of the batch break the table's"
        f" constraints [{'; '.join(declared)}], so Delta Lake refused the commit. Nothing was"
        " changed. Fix: correct or drop those rows before returning the batch; or, if a"
        f" constraint no longer holds for the data, drop it: {'; '.join(drops)}."
        f" Sample:\n{_preview(str(exc))}"
    )


def _preview(text: str) -> str:
    """delta-rs's table of refused rows, without the column it marks its inserts with."""
    lines = text.split("Preview of invalid data:", 1)[-1].strip().splitlines()
    if lines and "__delta_rs_" in lines[1 if len(lines) > 1 else 0]:
        # The marker column is the last: drop each line's last cell.
        lines = [line.rstrip()[:-1].rsplit(line[0], 1)[0] + line[0] for line in lines if line]
    return "\n".join(lines[:8])


def log_damage(exc: BaseException, where: str | None, uri: str, target: str) -> StorageError | None:
    """The error naming a damaged entry of ``uri``'s log, if ``exc`` is delta-rs failing on one.

    ``where`` is the publish refused ("asset 'x', partition D"); ``None`` for a read.
    """
    cause = plain(exc)
    if not _LOG.search(cause):
        return None
    entry, detail, last = _damaged_entry(uri)
    log = f"{uri.rstrip('/')}/_delta_log"
    restore = (
        f"restore {entry or 'the damaged entry'} from a backup or from the store's version"
        " history (delta-rs writes each entry whole, once, so it was changed afterwards); no"
        " version after it can be read or written until it is back"
    )
    if entry is not None and last is not None:
        restore += (
            f". If it is lost: it is the log's last entry, so deleting it"
            f" (os.remove({entry!r})) returns the table to version {last - 1}; then rerun the"
            f" partitions version {last} wrote"
        )
    return StorageError(
        (f"Refused to write {where}: the" if where else "The")
        + f" Delta log of table {target} ({log}) cannot be read ({_summary(cause)}){detail}."
        + (" Nothing was changed." if where else "")
        + f" Fix: {restore}."
    )


def _summary(cause: str) -> str:
    """delta-rs's reason, without its error kind's prefix or the Rust structures it prints."""
    reason = re.sub(r"^(?:(?:Kernel error|Generic delta kernel error): )+", "", cause)
    return re.split(r":? \w+ \{", reason, maxsplit=1)[0][:200]


def _damaged_entry(uri: str) -> tuple[str | None, str, int | None]:
    """A local log's first missing or unreadable entry, what is wrong, and its version if last.

    Deleting an unreadable last entry leaves a whole log; object storage is not looked into.
    """
    log = os.path.join(uri, "_delta_log")
    if "://" in uri or not os.path.isdir(log):
        return None, "", None
    versions = sorted(
        int(name[:-5]) for name in os.listdir(log) if re.fullmatch(r"\d{20}\.json", name)
    )
    for expected, version in enumerate(versions, start=versions[0] if versions else 0):
        if version != expected:
            path = os.path.join(log, f"{expected:020d}.json")
            return path, f": log entry {expected:020d}.json is missing", None
    if versions and versions[0] != 0 and not any(".checkpoint" in n for n in os.listdir(log)):
        path = os.path.join(log, f"{0:020d}.json")
        return path, f": log entry {0:020d}.json is missing", None
    for version in versions:
        path = os.path.join(log, f"{version:020d}.json")
        with open(path, encoding="utf-8", errors="replace") as entry:
            text = entry.read()
        try:
            for line in text.splitlines():
                if line.strip():
                    json.loads(line)
        except ValueError:
            last = version if version == versions[-1] else None
            return path, f": log entry {version:020d}.json is cut short or not JSON", last
    return None, "", None


def denied(exc: BaseException, where: str, root: str) -> StorageError | None:
    """The error naming a path the publish may not write, if ``exc`` is the system refusing."""
    cause = plain(exc)
    found = _DENIED.search(cause)
    if found is None:
        return None
    path = _DENIED_PATH.search(cause)
    reason = _REASONS[found[1] or found[2]]
    local = "://" not in root
    if reason == "operation not permitted":
        how = f"chattr -R -i {root!r}" if local else "the object store's permissions"
        fix = f"make it writable (an immutable file or directory: {how})"
    elif reason == "read-only file system":
        fix = "mount the file system read-write (or move the root to one that is)"
    else:
        how = f"chmod -R u+w {root!r}" if local else "its credentials or the bucket's policy"
        fix = f"give the user running the publish write access ({how})"
    return StorageError(
        f"Refused to write {where}: Delta Lake may not write"
        f" {path[1] if path else 'under ' + root}: {reason}. Nothing was changed: no"
        " version was committed (a data file written before the refusal is not part of the"
        f" table). Fix: {fix}, then rerun the partition."
    )

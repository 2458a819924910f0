"""What a failed delta-rs call means: a commit another writer won, or a cause to name.

delta-rs raises one ``CommitFailedError`` both for a commit that lost to a concurrent writer and
for a table that can never take the commit (an append-only table, a feature it cannot write), so
the publish tells them apart by delta-rs's own messages: only a lost commit is worth deciding
again on the new version (:func:`lost_commit`).
"""

import re

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


def lost_commit(exc: BaseException) -> str | None:
    """The first line of ``exc`` when it says another writer committed first, else ``None``."""
    text = str(exc).strip()
    first = text.split("\n")[0]
    return first if _LOST.search(first) else None

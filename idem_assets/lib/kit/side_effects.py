"""What an asset's own code does outside its IO managers and the outbox, seen through audit hooks.

Python raises an audit event for every ``open()`` and ``os.replace``, for each HTTP request sent
through ``http.client`` (which ``urllib``, ``requests`` and ``urllib3`` use) and for each SMTP
connection (``smtplib``). While a :func:`watching` block is active, the events raised inside an
asset's or a check's step are recorded, except those raised inside an IO manager
(``handle_output``/``load_input``) or inside an :class:`~idem_assets.Outbox` delivery: a file
written for writing, a request that writes (``POST``, ``PUT``, ``PATCH``, ``DELETE``), a mail
server reached. What raises no such event is not seen: files written by C or Rust code (pyarrow,
Polars, DuckDB's ``COPY``), requests of clients that open their own sockets (httpx, aiohttp,
gRPC), and anything done by another process.
"""

import http.client
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Literal

from dagster._core.execution.context.compute import current_execution_context

from idem_assets.lib.outbox.outbox import OUTBOX_SENDING

#: Methods of a request that changes something at the receiver; a GET only reads.
WRITING_METHODS = ("POST", "PUT", "PATCH", "DELETE")
_EVENTS = frozenset({"open", "os.rename", "http.client.send", "smtplib.connect"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_STORE_METHODS = frozenset({"handle_output", "load_input"})


@dataclass(frozen=True)
class SideEffect:
    """One thing an asset's code did outside its IO managers and the outbox."""

    kind: Literal["file", "request"]
    #: The asset (or check) whose step did it, and the partition(s) of its run.
    asset: str
    partition: str | None
    #: An absolute path, or ``"POST http://host:port/path"``, or ``"SMTP host:port"``.
    target: str


@dataclass
class Watch:
    """The side effects recorded while it was active, in the order they happened."""

    effects: list[SideEffect] = field(default_factory=list)


_WATCH: ContextVar[Watch | None] = ContextVar("idem_side_effect_watch", default=None)
_installed = False


@contextmanager
def watching() -> Iterator[Watch]:
    """Record the side effects of the steps run inside the block."""
    _install()
    watch = Watch()
    token = _WATCH.set(watch)
    try:
        yield watch
    finally:
        _WATCH.reset(token)


def _install() -> None:
    # An audit hook cannot be removed, so one is added once and does nothing outside a watch.
    global _installed
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event not in _EVENTS:
        return
    watch = _WATCH.get()
    if watch is None or OUTBOX_SENDING.get():
        return
    try:
        found = _target(event, args)
        if found is None:
            return
        step = _current_step()
        if step is None or _inside_an_io_manager(sys._getframe(1)):
            return
        watch.effects.append(SideEffect(found[0], step[0], step[1], found[1]))
    except Exception:  # An exception here would fail the user's own open() or request.
        pass


def _target(event: str, args: tuple[Any, ...]) -> tuple[Literal["file", "request"], str] | None:
    """What an event writes to, or ``None`` for a read."""
    if event == "open":
        path, mode, flags = args
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            mode is None and isinstance(flags, int) and bool(flags & _WRITE_FLAGS)
        )
        if not writes or isinstance(path, int):
            return None
        return "file", os.path.abspath(os.fsdecode(path))
    if event == "os.rename":
        return "file", os.path.abspath(os.fsdecode(args[1]))
    if event == "smtplib.connect":
        return "request", f"SMTP {args[1]}:{args[2]}"
    connection, data = args
    if not isinstance(data, bytes | bytearray | memoryview):
        return None
    method, _, rest = bytes(data[:2048]).partition(b" ")
    verb = method.decode("ascii", "replace")
    if verb not in WRITING_METHODS:
        return None
    path = rest.split(b" ", 1)[0].decode("ascii", "replace")
    scheme = "https" if isinstance(connection, http.client.HTTPSConnection) else "http"
    return "request", f"{verb} {scheme}://{connection.host}:{connection.port}{path}"


def _current_step() -> tuple[str, str | None] | None:
    """The asset (or check) of the step running now and its partition(s), if a step runs."""
    context = current_execution_context.get()
    if context is None:
        return None
    op_context: Any = getattr(context, "op_execution_context", context)
    try:
        name = op_context.asset_key.to_user_string()
    except Exception:  # A multi-asset or check step has no one asset key.
        name = op_context.op_def.name
    partition = None
    if op_context.has_partition_key:
        partition = str(op_context.partition_key)
    elif op_context.has_partition_key_range:
        keys = op_context.partition_keys
        partition = f"{keys[0]}...{keys[-1]}"
    return name, partition


def _inside_an_io_manager(frame: FrameType | None) -> bool:
    """Whether an IO manager's ``handle_output`` or ``load_input`` is on the stack: a store."""
    while frame is not None:
        if frame.f_code.co_name in _STORE_METHODS:
            return True
        frame = frame.f_back
    return False

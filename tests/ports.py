"""Ports for the servers the tests start, and what to do when another process takes one first.

A port that was free when it was chosen can be bound by another process before the server given
it binds it: under `make test` the other pytest worker starts PostgreSQL clusters, webservers
and code servers too. So every harness starts a server through `start_on_a_free_port`, reports a
lost race as `PortTakenError` (its server exited saying the address was in use), and checks
that the server answering on the port is the one it started.
"""

import itertools
import os
import re
import socket
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

#: Each attempt loses only if another process binds the very port in the moment between the
#: choice and the bind, so a few attempts make a lost start as unlikely as anything else.
START_ATTEMPTS = 5

# What the servers print when another process holds their port: dagster-webserver (uvicorn)
# "[Errno 98] error while attempting to bind on address ...: address already in use",
# PostgreSQL "could not bind IPv4 address ...: Address already in use", and the gRPC code
# server "RuntimeError: Failed to bind to address 127.0.0.1:<port>".
_BIND_FAILURE = re.compile(
    r"address already in use|could not bind|failed to bind to address", re.IGNORECASE
)

PortChooser = Callable[[], int]


class PortTakenError(RuntimeError):
    """A server could not have the port it was given: another process held it."""


def free_port() -> int:
    """Return a port that was free a moment ago on 127.0.0.1 (it may be taken before use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bind_failed(log_text: str) -> bool:
    """Whether a server's output says it could not bind its address."""
    return _BIND_FAILURE.search(log_text) is not None


def start_on_a_free_port(
    start: Callable[[int], T],
    choose_port: PortChooser = free_port,
    attempts: int = START_ATTEMPTS,
) -> T:
    """Call ``start(port)`` on a newly chosen port until it does not raise PortTakenError."""
    for attempt in range(1, attempts + 1):
        try:
            return start(choose_port())
        except PortTakenError:
            if attempt == attempts:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def listening_sockets(port: int) -> set[str]:
    """The ``socket:[inode]`` names of the TCP sockets listening on ``port``, any address."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            # State 0A is TCP_LISTEN; the local address is hex "ADDR:PORT".
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                found.add(f"socket:[{inode}]")
    return found


def open_files(pid: int) -> Iterator[str]:
    """What each open descriptor of process ``pid`` names (a path, ``socket:[inode]``...)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return
    for fd in fds:
        try:
            yield os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # Closed since it was listed.


def sockets_held_by(pids: Collection[int]) -> set[str]:
    """The ``socket:[inode]`` names of the sockets the processes have open."""
    return {t for pid in pids for t in open_files(pid) if t.startswith("socket:[")}


def held_only_by(port: int, pids: Collection[int]) -> bool:
    """Whether something listens on ``port`` and every listening socket belongs to ``pids``.

    Servers that set SO_REUSEPORT (gRPC does) can listen on one port side by side, and the
    kernel then splits the connections between them, so answering is not proof of owning.
    """
    listening = listening_sockets(port)
    return bool(listening) and listening <= sockets_held_by(pids)


def every_other_pick(port: int) -> PortChooser:
    """A port chooser whose 1st, 3rd, 5th... pick is ``port`` and the others free ports.

    With ``port`` held by another process, each server started in turn loses its first race.
    """
    picks = itertools.count()
    return lambda: port if next(picks) % 2 == 0 else free_port()

"""The engines under ``backends/``, found by their folders and imported only when used.

Each engine folder's ``__init__`` is light: it names what the engine adds to ``idem_assets``
(``EXPORTS``: public name -> the engine's module that defines it) and the extra that installs its
driver (``EXTRA``). Nothing here imports a driver: ``import idem_assets`` loads none, and a name
of an engine whose extra is missing fails when it is used, with the install command.
"""

import importlib
import pkgutil
from functools import cache
from types import ModuleType
from typing import Any

import idem_assets.lib.backends as _backends


@cache
def engines() -> dict[str, ModuleType]:
    """Every engine folder's light ``__init__`` module, by folder name."""
    found = {}
    for info in pkgutil.iter_modules(_backends.__path__):
        if info.ispkg:
            found[info.name] = importlib.import_module(f"{_backends.__name__}.{info.name}")
    return found


@cache
def exports() -> dict[str, tuple[str, str]]:
    """Public name -> (engine, module path) for every name an engine adds to ``idem_assets``."""
    found: dict[str, tuple[str, str]] = {}
    for engine, module in engines().items():
        for name, where in getattr(module, "EXPORTS", {}).items():
            found[name] = (engine, f"{module.__name__}.{where}")
    return found


def exported(name: str) -> Any:
    """The object an engine exports as ``name``, its module imported now."""
    engine, path = exports()[name]
    try:
        module = importlib.import_module(path)
    except ImportError as exc:
        extra = getattr(engines()[engine], "EXTRA", None)
        if extra is None:
            raise
        raise ImportError(
            f"idem_assets.{name} needs the {engine} engine's driver, which is not installed"
            f" ({exc}). Fix: pip install 'idem_assets[{extra}]'."
        ) from exc
    return getattr(module, name)


def wrap(store: object) -> Any:
    """The backend of the engine whose connections ``store`` is one of (a DuckDB connection).

    Engines name the top-level modules of the connection types they wrap (``WRAPS``: module ->
    ``"backend_module:BackendClass"``), so ``ia.publish(duckdb.connect(...), ...)`` works
    without the neutral core knowing DuckDB.
    """
    top = type(store).__module__.split(".")[0]
    # An engine's own module first; "*" takes any other object (a proxy of a connection).
    for key in (top, "*"):
        for module in engines().values():
            target = getattr(module, "WRAPS", {}).get(key)
            if target is None:
                continue
            where, _, name = target.partition(":")
            return getattr(importlib.import_module(f"{module.__name__}.{where}"), name)(store)
    raise TypeError(
        f"{type(store).__name__} is neither an idem_assets Backend nor a connection an engine"
        " wraps. Fix: pass a DuckDB connection (duckdb.connect(...)) or a backend such as"
        " PostgresBackend or DeltaBackend."
    )

"""Validation and quoting of SQL identifiers.

Identifiers cannot be bound as parameters, so they are the one place SQL text is assembled from
names. Only plain names are accepted; quoting then makes reserved words (``order``, ``date``) safe.
"""

import re

from idem_assets.lib.errors import InvalidIdentifierError

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def validate_identifier(name: object, what: str) -> str:
    """Return ``name`` if it is a plain identifier (letters, digits, underscore), else raise."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise InvalidIdentifierError(
            f"{what} {name!r} is not a plain identifier. Use letters, digits and underscores only,"
            " starting with a letter or underscore (at most 63 characters); rename the column or"
            " table rather than quoting it yourself."
        )
    return name


def quote(name: str) -> str:
    """Double-quote an identifier that :func:`validate_identifier` accepted."""
    return '"' + name.replace('"', '""') + '"'


def qualified(schema: str, table: str) -> str:
    """Return ``"schema"."table"`` after validating both parts."""
    return (
        f"{quote(validate_identifier(schema, 'schema'))}."
        f"{quote(validate_identifier(table, 'table'))}"
    )

"""Validation and quoting of SQL identifiers.

Identifiers cannot be bound as parameters, so they are the one place SQL text is assembled from
names. Only plain names are accepted: letters of any script, digits and underscores. Quoting then
makes reserved words (``order``, ``date``) and non-ASCII names (``tarifa_é``) safe.
"""

import re

from idem_assets.lib.model.errors import InvalidIdentifierError

MAX_LENGTH = 63

# fullmatch, not match with "$": "$" also matches before a trailing newline. Unicode \w is any
# script's letters and digits plus the underscore; the first character may not be a digit.
_IDENTIFIER = re.compile(rf"[^\W\d]\w{{0,{MAX_LENGTH - 1}}}")


def validate_identifier(name: object, what: str) -> str:
    """Return ``name`` if it is a plain identifier (letters, digits, underscore), else raise."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise InvalidIdentifierError(
            f"{what} {name!r} is not a plain identifier. Use letters, digits and underscores only"
            " (letters of any script), starting with a letter or underscore, at most"
            f" {MAX_LENGTH} characters; no spaces, quotes, dots or control characters. Nothing"
            f" was changed. Fix: rename the column or table, e.g. to {_suggest(name)!r}, rather"
            " than quoting it yourself."
        )
    return name


def _suggest(name: object) -> str:
    plain = re.sub(r"\W+", "_", str(name).strip()).strip("_") or "column"
    return ("_" + plain if plain[0].isdigit() else plain)[:MAX_LENGTH]


def quote(name: str) -> str:
    """Double-quote an identifier that :func:`validate_identifier` accepted."""
    return '"' + name.replace('"', '""') + '"'


def qualified(schema: str, table: str) -> str:
    """Return ``"schema"."table"`` after validating both parts."""
    return (
        f"{quote(validate_identifier(schema, 'schema'))}."
        f"{quote(validate_identifier(table, 'table'))}"
    )

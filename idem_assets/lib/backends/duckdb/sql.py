"""The statements only DuckDB spells: its catalog queries and ``INSERT ... BY NAME``.

Every other statement the DuckDB backend runs is :mod:`idem_assets.lib.sql.statements`',
rendered in DuckDB's dialect.
"""

from collections.abc import Sequence

import sqlglot
from sqlglot import exp

from idem_assets.lib.sql.predicates import Statement, terms


def table_columns() -> str:
    """A table's columns and DuckDB types, by schema and name (``$1``, ``$2``), in order."""
    # duckdb_columns() is the catalog itself; information_schema is a slower view over it.
    # Names compare without regard to case, as DuckDB resolves them.
    return (
        "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name ="
        " current_database() AND lower(schema_name) = lower($1) AND lower(table_name) ="
        " lower($2) ORDER BY column_index"
    )


def describe() -> str:
    """One catalog scan for a table's columns and the owners table's.

    Parameters: the owners table's name and schema, the table's schema and name, the owners
    table's schema and name again. Rows: ``(is the owners table, column, type)``.
    """
    return (
        "SELECT table_name = $1 AND schema_name = $2, column_name, data_type FROM"
        " duckdb_columns() WHERE database_name = current_database() AND ((lower(schema_name)"
        " = lower($3) AND lower(table_name) = lower($4)) OR (schema_name = $5 AND table_name ="
        " $6)) ORDER BY column_index"
    )


def constraints() -> str:
    """How many constraints and unique indexes a table has, by schema and name (``$1``, ``$2``)."""
    table = (
        "database_name = current_database() AND lower(schema_name) = lower($1) AND"
        " lower(table_name) = lower($2)"
    )
    return (
        f"SELECT (SELECT count(*) FROM duckdb_constraints() WHERE {table}) + (SELECT count(*)"
        f" FROM duckdb_indexes() WHERE {table} AND is_unique)"
    )


def insert_by_name(target: str, source: str, order_by: Sequence[str] = ()) -> str:
    """Insert ``source`` matching columns by name, in partition order when one is given.

    Inserting in partition order keeps each partition in few row groups, so DuckDB's zone maps
    let the next window delete skip the rest of the table.
    """
    order = ""
    if order_by:
        order = " ORDER BY " + ", ".join(c.sql("duckdb") for c in terms(order_by))
    return f"INSERT INTO {target} BY NAME SELECT * FROM {source}{order}"


def fenced(delete: Statement, first_new: int) -> Statement:
    """``delete`` kept to rows numbered below ``first_new``: the table's own, not the batch's."""
    tree = sqlglot.parse_one(delete.sql, dialect="duckdb")
    assert isinstance(tree, exp.Delete), delete.sql
    fence = f"rowid < {int(first_new)}"
    return Statement(tree.where(fence, dialect="duckdb").sql(dialect="duckdb"), delete.params)

"""One region -> predicate builder and every statement, rendered per dialect (sqlglot)."""

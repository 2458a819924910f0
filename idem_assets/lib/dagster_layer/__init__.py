"""The Dagster layer: IO managers, audited assets, checks, verdicts and data versions."""

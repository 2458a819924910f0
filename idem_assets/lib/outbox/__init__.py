"""The outbox: side effects a rerun does not repeat."""

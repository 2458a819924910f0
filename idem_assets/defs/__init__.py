"""The taxi-trips code location: daily assets written through the idempotent IO managers."""

"""Engines the idempotent publish can write to, one module each behind the protocol."""

"""The replace contract every backend must keep, run once per backend."""

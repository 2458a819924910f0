"""Tests of defs."""

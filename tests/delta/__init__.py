"""Tests of the Delta Lake backend beyond the conformance suite."""

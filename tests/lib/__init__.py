"""Tests of lib."""

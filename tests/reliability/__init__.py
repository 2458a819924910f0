"""Tests of reliability."""

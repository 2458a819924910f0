"""Benchmarks of idem_assets against DuckDB's own speed; run them with ``make bench``.

Each benchmark measures its pair of cases interleaved in the same process (A, B, B, A, ...), so a
busy shared machine slows both sides alike; results are medians and ratios of medians.
"""

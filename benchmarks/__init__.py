"""Benchmarks of idem_assets against DuckDB's own speed; run them with ``make bench``.

Each benchmark measures its pair of cases interleaved in the same process (A, B, B, A, ...), so a
busy shared machine slows both sides alike; results are medians and ratios of medians.
"""

import sys
from pathlib import Path

# The harnesses reused from tests/ (postgres_server.py) import their siblings (ports.py) as
# pytest runs them, with tests/ on the path.
_TESTS = str(Path(__file__).resolve().parents[1] / "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)

"""The reusable library: idempotent IO managers, SQL builders, guards and the check vocabulary."""

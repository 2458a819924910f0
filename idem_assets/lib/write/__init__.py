"""The write path: fit, stage, guard, then one transaction per publish; the engine seam."""

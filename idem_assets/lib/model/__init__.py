"""The model: partition windows and regions, per-asset settings, identifiers, errors."""

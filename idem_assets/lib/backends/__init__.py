"""The engines, one folder each; :mod:`.registry` finds them without importing their drivers."""

"""Fast, single-process tests."""

"""Tests that start processes, hosts or time the wall clock."""

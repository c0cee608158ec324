"""Helpers the tests share: fixtures, oracles, process and host tools."""

"""Differences the harness found, each a test written by `differential.writer` (see tests/differential)."""

"""Helpers shared by tests of several areas (real files and processes, no mocks)."""

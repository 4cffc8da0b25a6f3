"""Placeholder: the child bootstrap is written by the live-capture work."""

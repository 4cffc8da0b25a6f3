"""The error type every part raises for problems a user must act on (bad input, full disk...).

The CLI prints its message as one line and exits with code 2; anything else is a bug.
"""

from __future__ import annotations


class LayerwatchError(Exception):
    """A problem with the user's input or environment, explained in one line."""

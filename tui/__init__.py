"""The Textual app and the command line: a view over engine results that owns no numerics."""

"""Turn tensors into verdicts: readers, pairing, metrics, thresholds, the incremental session.

Headless: no Textual import anywhere below this package (a hygiene test enforces it). The
TUI and the CLI consume results through :mod:`layerwatch.engine.seam` only.
"""

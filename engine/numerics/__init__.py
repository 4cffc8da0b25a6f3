"""The numerics: metrics, segments, logits, statistics, thresholds, local verdicts, precheck
references, ``compare_pair``, explain.

Functions of arrays and plain records. Below the session and every front end: from the rest of
the engine they import only ``records``, ``seam`` (the plain result records they fill) and
``readers/load.py`` (a record's bytes, streamed chunk by chunk); ``tests/test_layering.py``
holds that, so every verdict can be recomputed from two tensors without a session.
"""

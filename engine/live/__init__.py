"""The live pipeline: arrivals from the watchers in, result batches for a front end out.

One worker thread reads each side's changed files, feeds a comparison session and flushes
batches to a sink; ``gc_tuning`` keeps collector pauses short for the front ends.
"""

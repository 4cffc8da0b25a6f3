"""The incremental comparison session: pairing, mapping, blocks and cells, findings.

It takes tensor records of both runs in any order and keeps the pairs, their verdicts, the
grid's cells, the first failure and the root cause; results do not depend on arrival order.
"""

"""Pure numerics over arrays: metrics, segments, logits, statistics, thresholds, precheck.

Functions of numpy arrays and plain records only: nothing here imports another engine
package (a layering test holds that), so every verdict can be recomputed from two arrays.
"""

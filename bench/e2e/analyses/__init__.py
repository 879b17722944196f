"""Analyses of the end-to-end grid: each reads a grid's JSON (or measures one of the grid's
conditions) and reports what the grid's own summary does not.

They import the grid (:mod:`bench.e2e`) and :mod:`bench.harness`; the grid never imports them.
"""

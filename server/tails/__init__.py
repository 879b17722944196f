"""Tails: the worker pool and its batches, request bodies and activation packets, the answers
they build, and the prices of running and decoding them."""

__all__: list[str] = []  # a wing: its modules are imported by name; the face is qpart.server

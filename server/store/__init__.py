"""The segment store: the loaded model catalog, the cache of encoded head segments and their index."""

__all__: list[str] = []  # a wing: its modules are imported by name; the face is qpart.server

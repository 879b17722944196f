"""The HTTP face: the app and its routes, request limits, the OIP codec and the one mapping of
errors to responses. Routes validate, call one Engine method and answer
(tests/server/api/test_engine_face.py)."""

__all__: list[str] = []  # a wing: its modules are imported by name; the face is qpart.server

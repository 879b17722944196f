"""Planning: the cost model's choice of cut and bits (planner), input-image plans and their
formats. No FastAPI and no tails."""

__all__: list[str] = []  # a wing: its modules are imported by name; the face is qpart.server

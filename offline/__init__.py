"""offline package (see docs/architecture.md)."""

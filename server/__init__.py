"""server package (see docs/architecture.md)."""

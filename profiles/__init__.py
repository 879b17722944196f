"""profiles package (see docs/architecture.md)."""

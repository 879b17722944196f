"""client package (see docs/architecture.md)."""

"""The qpart command-line entry point."""

"""Management commands of the demo shop."""

"""Management commands of reactor_app."""

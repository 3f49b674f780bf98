"""The demo shop: reactors that show step-scoped coordination end to end."""

"""The engine: plans a reactor's steps and executes them with retries, coordination and rollback."""

"""Chaos tests run real worker processes: the worker tests' fixtures, shared."""

from __future__ import annotations

from tests.worker.conftest import celery_worker_settings, fresh_traces, worker

__all__ = ["celery_worker_settings", "fresh_traces", "worker"]

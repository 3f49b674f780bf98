"""Tests of the demo shop: its reactors, run in-process and on real Celery workers."""

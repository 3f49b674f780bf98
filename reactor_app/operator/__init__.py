"""Operator logic shared by the admin and the API: live coordination state and operator verbs.

``live`` reads holds and key state out of Redis, shaped for display; ``operations`` holds the
verbs (force release, ordered-lock skip and reset) that leave an audit event. Neither knows
about requests, forms or DRF, so the admin works without the ``[api]`` extra installed (the
import contracts in pyproject.toml keep it that way).
"""

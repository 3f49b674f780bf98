"""Redis coordination: locks, semaphores, rate limits, dedup periods and ordered locks.

The package is layered as follows (docs/design.md §3):

* ``claims`` — what a unit of work asks for and what admission answers;
* ``redis`` — the client, and which of its errors are outages (``CoordinationUnavailable``);
* ``keys`` — every Redis key name;
* ``scripts`` — the Lua script registry, its calls and the status-code table;
* ``lock``, ``semaphore``, ``rate_limit``, ``period``, ``ordered_lock`` — one module per
  primitive, each owning its key layout, its part of the script argument encoding and its
  state reader;
* ``admission`` — the ``Coordinator``: one atomic admission and one release per unit of work,
  built from ``script_args`` (what the scripts are sent) and ``replies`` (how their answers
  read); its other verbs live with their concern: ``waiting`` (waiting for contention to clear,
  the waiter orders), ``leases`` (extending leases), ``forced_release`` (an operator's removal
  of a hold) and ``refusals`` (refusals as exceptions);
* ``renewal`` — the auto-extend / heartbeat thread;
* ``state`` — read-only snapshots for operators and tests;
* ``embedded`` — the bundled Redis server used when no URL is configured.

Nothing is imported here on purpose: the settings module imports ``embedded`` while Django is
still being configured, so this package must not touch settings at import time.
"""

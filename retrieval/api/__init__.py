"""The memory an agent uses: :class:`retrieval.api.memory.Memory` adds turns as they
happen, searches them at once, scopes everything to a user and forgets completely. One concept
per module: ``errors`` (the typed exceptions), ``results`` (what calls return), ``limits`` (every
limit and default of a call), ``inputs`` (checking turns and ids), ``replay`` (when an add is a
replay or a conflict), ``tokens`` (opaque per-user cursors and job ids), ``loading`` (the models
by name), ``online`` (the open segments), ``backlog`` (the ingestion worker behind the add),
``batch`` (recorded conversations through the same stream), ``states`` (the users' snapshots —
each a :class:`retrieval.multi_route.bank.MemoryBank` — kept fresh and bounded), ``search`` (one
search), ``purge`` (hard deletion), ``jobs`` (durable consolidation jobs), ``closing`` (the call
gate and per-user guards of an open memory), ``bulk`` (a recorded conversation through ``add``),
``memory`` (the API).
"""

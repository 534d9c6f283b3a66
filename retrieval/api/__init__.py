"""The memory an agent uses: :class:`retrieval.api.memory.Memory` adds turns as they
happen, searches them at once, scopes everything to a user and forgets completely. One concept
per module: ``errors`` (the typed exceptions), ``results`` (what calls return), ``limits`` (every
limit and default of a call), ``inputs`` (checking turns and ids), ``replay`` (when an add is a
replay or a conflict), ``tokens`` (opaque per-user cursors and job ids), ``loading`` (the models
by name), ``online`` (the open segments), ``snapshot`` (one user's search arrays), ``states`` (the
snapshots kept, fresh and bounded), ``search`` (one search), ``purge`` (hard deletion), ``jobs``
(durable consolidation jobs), ``closing`` (the call lock of an open memory), ``bulk`` (a recorded
conversation through ``add``), ``memory`` (the API).
"""

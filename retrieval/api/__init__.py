"""The memory an agent uses: :class:`retrieval.api.memory.Memory` adds turns as they
happen, searches them at once, scopes everything to a user and forgets completely. One concept
per module: ``errors`` (the typed exceptions), ``results`` (what calls return), ``inputs``
(checking turns and ids), ``online`` (the open segments), ``snapshot`` (one user's search
arrays), ``purge`` (hard deletion), ``jobs`` (durable consolidation jobs), ``memory`` (the API).
"""

"""The HTTP routers, one per resource: sessions (turns in, a session out), search, memories,
the user, consolidation jobs, and the unauthenticated system routes (health, metrics)."""

"""The memory's store on PostgreSQL (:class:`retrieval.memory.postgres.store.PostgresStore`): the
same API as the SQLite store, in parts that mirror its parts, for memories served by several
processes over one database."""

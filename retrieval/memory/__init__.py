"""Memory records and the durable AMU store: the data floor of :mod:`retrieval` (it imports nothing
above itself)."""

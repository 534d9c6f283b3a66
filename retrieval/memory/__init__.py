"""Memory records, the durable AMU store, online segmentation and ingestion."""

"""The LoCoMo evaluation: loading, evidence, metrics, configurations, construction, the run,
rendering and paired statistics."""

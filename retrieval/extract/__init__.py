"""Segment-level memory encoding: relative dates, pronouns, the rule and the LLM extractors."""

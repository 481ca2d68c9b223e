"""Overflow to aggregators: the aggregator protocol, their registry, and the budget and health store
(docs/resilience.md). The pipeline's overflow child cycle calls these; nothing here relays to a caller."""

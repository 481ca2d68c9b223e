"""Platform-tier capacity: signatures (how a vendor says "out"), the classifier, the breaker's store and
lock view, and the spacer. Plain Python components the call pipeline calls (docs/resilience.md)."""

"""Model evaluation: registry aliases, the evaluation scheduler and workers, metrics, provenance
and caching, quality gates and promotion. See docs/evaluation.md."""

"""The HTTP API: ingest, the run read API, OpenAPI, /metrics."""

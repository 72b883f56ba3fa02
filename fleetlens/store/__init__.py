"""Stores: telemetry (ClickHouse SQL: chDB embedded, a server at scale) and metadata (SQL)."""

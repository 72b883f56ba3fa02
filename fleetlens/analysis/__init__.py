"""Analyses: pure functions from arrays to small results; the server does the I/O."""

"""Runnable examples that ship with the package (``python -m fleetlens.examples.ddp_train``)."""

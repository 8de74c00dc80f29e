"""Runnable demonstrations (``make demo``)."""

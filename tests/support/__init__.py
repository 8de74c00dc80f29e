"""Helpers shared by test modules (broker processes)."""

"""Helpers of the crash and damage tests: child-process scripts and expected content."""

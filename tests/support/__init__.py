"""What test modules share besides conftest's fixtures: broker processes and threads, child
scripts (run as ``python tests/support/X.py`` or ``python -m tests.support.X``), expected
content, and plugins of fixtures (registered in tests/conftest.py). No test module imports
another; what two of them need lives here."""

"""The examples in docstrings are run, so the documentation cannot drift from the code."""

import doctest
import importlib

import pytest

MODULES = [
    "headwater",
    "headwater.model.message",
    "headwater.model.config",
    "headwater.model.batch",
    "headwater.client.producer",
    "headwater.client.consumer",
    "headwater.testing",
    "headwater.aio",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0, f"{name} has no examples"

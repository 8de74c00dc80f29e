"""The examples in docstrings are run, so the documentation cannot drift from the code.

Every module of the package whose source holds an example is found and run; an example
that needs a live Spark session is marked ``+SKIP`` where it stands."""

import doctest
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

import headwater


def _modules_with_examples() -> list[str]:
    found = []
    for info in pkgutil.walk_packages(headwater.__path__, "headwater."):
        spec = importlib.util.find_spec(info.name)
        if spec is not None and spec.origin and Path(spec.origin).read_text(encoding="utf-8").count(">>> "):
            found.append(info.name)
    init = Path(headwater.__file__).read_text(encoding="utf-8")
    return (["headwater"] if ">>> " in init else []) + sorted(found)


MODULES = _modules_with_examples()


def test_the_modules_with_examples_are_found():
    for name in (
        "headwater",
        "headwater.client.sync.producer",
        "headwater.client.core.batching",
        "headwater.model.batch",
    ):
        assert name in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    skipped_only = name == "headwater.spark.datasource"  # its example needs a Spark session
    assert result.attempted > 0 or skipped_only, f"{name} has no examples that run"

"""Run the Python examples of a Markdown guide, in order, as a reader would paste them into
one interpreter: ``python tests/support/doc_examples.py GUIDE.md [ADDRESS]``.

Every ```` ```python ```` block of the guide runs, top to bottom, in one namespace, in the
current directory (the test gives each guide an empty one). The guides talk to a broker at
``127.0.0.1:7070`` (the cluster guide to brokers at ``127.0.0.1:7071,127.0.0.1:7072,
127.0.0.1:7073``); with ADDRESS that string is replaced by it, so the test can start its own
broker (or cluster) on free ports. A line ``[example at GUIDE:LINE ran]`` follows each block; the first
block that raises prints its traceback, with the guide's own line numbers, and ends the run
with exit status 1.
"""

from __future__ import annotations

import re
import sys
import traceback
from pathlib import Path

GUIDE_ADDRESS = "127.0.0.1:7070"
GUIDE_CLUSTER = "127.0.0.1:7071,127.0.0.1:7072,127.0.0.1:7073"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def examples(text: str) -> list[tuple[int, str]]:
    """``(line, source)`` of each Python block of a Markdown text, ``line`` being the line of
    the block's first source line.

    >>> examples("# t\\n\\n```python\\nx = 1\\n```\\n\\n```sh\\nls\\n```\\n")
    [(4, 'x = 1\\n')]
    """
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


def run(guide: Path, address: str | None = None) -> int:
    namespace: dict = {"__name__": "__main__"}
    for line, source in examples(guide.read_text()):
        if address is not None:
            source = source.replace(GUIDE_CLUSTER, address).replace(GUIDE_ADDRESS, address)
        try:
            # the padding makes a traceback give the guide's line numbers
            exec(compile("\n" * (line - 1) + source, str(guide), "exec"), namespace)
        except BaseException:  # noqa: BLE001 - any failure of an example is the finding
            traceback.print_exc()
            print(f"[example at {guide.name}:{line} failed]", flush=True)
            return 1
        print(f"[example at {guide.name}:{line} ran]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None))

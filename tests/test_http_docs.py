"""docs/http.md's curl examples run as written, in order, against a live ``headwater serve
--http-port`` (the guide's ``localhost:8080`` replaced by its port), as if pasted into one
terminal: every line must succeed, no block prints an error unless it says it fails
(``# fails``), and the output shows the examples did their work."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from tests.support.doc_shell import shell_blocks  # noqa: E402 - after the skips
from tests.support.http_gateway import HttpBroker  # noqa: E402

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "http.md"

#: What the examples print when they work, in the order they print it.
SHOWS = [
    '"name":"orders"',  # created
    '"ttl_s":2592000,"flush":"sync"',  # altered
    '{"partition":0,"offset":0,"id":',  # the batch's first message
    '"delayed":true',
    '[1,"AAEC/w==","base64"]',  # a binary value read back as base64
    '{"id": 17}',  # looked up by id, then found by key
    '"name":"QueueNotFoundError"',
    "unknown field `valeu`",
    '{"queue":"orders","offsets":{}}',  # the group deleted
    '"acked":',
    "event: record",
    '"value":"{\\"id\\": 17}"',  # the one event after Last-Event-ID 0:2,1:0: partition 1's first
    "audit",
    '"name":"UnsupportedMediaType"',  # who may call it
    '"name":"OriginNotAllowed"',
]


@pytest.mark.skipif(shutil.which("jq") is None or shutil.which("curl") is None, reason="needs curl and jq")
def test_the_curl_examples_run_as_written(tmp_path):
    broker = HttpBroker(tmp_path / "data")
    try:
        blocks = shell_blocks(GUIDE.read_text(), {"sh"})
        assert len(blocks) >= 8
        script = ["set -e -o pipefail"]
        for i, (line, lines) in enumerate(blocks):
            script.append(f"echo '@@block {i} (docs/http.md:{line})'")
            script += [x.replace("localhost:8080", f"127.0.0.1:{broker.http_port}") for x in lines]
            script.append("echo")
        out = subprocess.run(
            ["bash", "-c", "\n".join(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
    finally:
        broker.stop()
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    printed = re.split(r"^@@block \d+ ", out.stdout, flags=re.M)[1:]
    for (line, lines), text in zip(blocks, printed):
        if not any("# fails" in x for x in lines):
            assert '"error":' not in text, f"the block at docs/http.md:{line} printed an error:\n{text}"
    at = 0
    for expected in SHOWS:
        found = out.stdout.find(expected, at)
        assert found >= 0, f"the examples did not print {expected!r} (after position {at}):\n{out.stdout}"
        at = found

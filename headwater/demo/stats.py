"""What the demo computes, without Spark: the page-view rule, the results and their
comparison.

A line of the access log is a **page view** when a person fetched a page and got it: the
method is ``GET``, the status ``200``, the path (the request target without its query
string) is not a static asset or the health check, and the user agent is not a crawler or
the load balancer (it names none of :data:`ROBOT_WORDS`). The page is that path
(``/search?q=boots`` is a view of ``/search``); the visitor is the client address. The
Spark jobs (:mod:`headwater.demo.jobs`) apply the same rule with the same patterns;
:func:`parse_line` is the rule in Python, for the tests.

Results are :data:`Stats`: for each one-minute window (keyed by its start, seconds since
the epoch) and page, the page views and the distinct visitors; the page ``None`` stands
for the whole window (all its page views, and its distinct visitors, which are not the sum
of the pages'). In queue ``page-stats`` each result is one message, keyed by the page
(none for a whole window), tagged ``page`` or ``window``, its body JSON::

    {"window_start":"2025-03-04T09:06:00Z","page":"/cart","views":212,"users":187}
    {"window_start":"2025-03-04T09:06:00Z","views":6990,"users":2716}
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import NamedTuple

__all__ = [
    "LINE_PATTERN",
    "ASSET_PATTERN",
    "ROBOT_WORDS",
    "HEALTH_PATH",
    "Stats",
    "Parsed",
    "parse_line",
    "stats_of_truth",
    "stats_of_messages",
    "compare",
    "top_pages",
]

# Apache combined log format:
#   client ident user [time] "method target protocol" status size "referer" "agent"
# Groups: 1 client, 2 time, 3 method, 4 target, 5 status, 6 agent. Written for both
# Python's re and Java's regex (Spark), which agree on this subset.
LINE_PATTERN = r'^(\S+) \S+ \S+ \[([^\]]+)\] "(\S+) (\S+)[^"]*" (\d{3}) \S+ "[^"]*" "([^"]*)"$'
ASSET_PATTERN = r"\.(css|js|png|jpe?g|gif|svg|ico|woff2?|txt|xml|map)$"
ROBOT_WORDS = ("bot", "crawler", "spider", "healthchecker")  # in a lower-cased agent: not a person
HEALTH_PATH = "/healthz"
TIME_FORMAT_SPARK = "dd/MMM/yyyy:HH:mm:ss Z"  # 04/Mar/2025:09:00:00 +0000
TIME_FORMAT_PYTHON = "%d/%b/%Y:%H:%M:%S %z"
WINDOW_S = 60

_line = re.compile(LINE_PATTERN)
_asset = re.compile(ASSET_PATTERN)

Stats = dict[tuple[int, str | None], tuple[int, int]]
"""(window start in epoch seconds, page or None for the whole window) -> (views, visitors)."""


class Parsed(NamedTuple):
    time_s: int
    visitor: str
    page: str | None  # None: not a page view


def parse_line(text: str) -> Parsed | None:
    """The page-view rule in Python (None for a line that is not in the combined format).

    >>> parse_line('1.2.3.4 - - [04/Mar/2025:09:00:07 +0000] "GET /search?q=boots HTTP/1.1" '
    ...            '200 512 "-" "Mozilla/5.0"')
    Parsed(time_s=1741078807, visitor='1.2.3.4', page='/search')
    >>> parse_line('1.2.3.4 - - [04/Mar/2025:09:00:07 +0000] "GET /img/logo.svg HTTP/1.1" '
    ...            '200 512 "-" "Mozilla/5.0"').page is None
    True
    """
    m = _line.match(text)
    if m is None:
        return None
    client, when, method, target, status, agent = m.groups()
    time_s = int(datetime.strptime(when, TIME_FORMAT_PYTHON).timestamp())
    path = target.split("?", 1)[0]
    view = (
        method == "GET"
        and status == "200"
        and path != HEALTH_PATH
        and _asset.search(path) is None
        and not any(w in agent.lower() for w in ROBOT_WORDS)
    )
    return Parsed(time_s, client, path if view else None)


def stats_of_truth(truth) -> Stats:
    """The generator's own counts (a :class:`~headwater.demo.accesslog.Truth`) as Stats."""
    out: Stats = {(w, p): v for (w, p), v in truth.per_page().items()}
    out.update({(w, None): v for w, v in truth.per_window().items()})
    return out


def stats_of_messages(bodies: Iterable[bytes]) -> tuple[Stats, int]:
    """The results held by ``page-stats`` messages, and how many messages repeated a
    result already seen (an exactly-once sink leaves none)."""
    out: Stats = {}
    repeated = 0
    for body in bodies:
        r = json.loads(body)
        start = int(datetime.fromisoformat(r["window_start"].replace("Z", "+00:00")).timestamp())
        key = (start, r.get("page"))
        if key in out:
            repeated += 1
        out[key] = (int(r["views"]), int(r["users"]))
    return out, repeated


def compare(expected: Stats, got: Stats, *, limit: int = 5) -> list[str]:
    """What differs between two sets of results, at most ``limit`` lines (empty: equal)."""
    diffs = []
    for key in sorted(expected.keys() | got.keys(), key=lambda k: (k[0], k[1] or "")):
        want, have = expected.get(key), got.get(key)
        if want != have:
            when = datetime.fromtimestamp(key[0], UTC).strftime("%H:%M")
            diffs.append(f"{when} {key[1] or '(all pages)'}: expected {_vu(want)}, got {_vu(have)}")
    if len(diffs) > limit:
        diffs = diffs[:limit] + [f"... and {len(diffs) - limit} more"]
    return diffs


def _vu(v: tuple[int, int] | None) -> str:
    return "nothing" if v is None else f"{v[0]} views/{v[1]} visitors"


def top_pages(
    stats: Mapping[tuple[int, str | None], tuple[int, int]],
    n: int = 10,
) -> tuple[list[int], list[tuple[str, int, list[int]]]]:
    """The windows in order, and the ``n`` most viewed pages: (page, views, views per window).

    >>> windows, top = top_pages({(0, "/"): (5, 3), (60, "/"): (2, 2), (60, "/cart"): (4, 1),
    ...                           (0, None): (5, 3), (60, None): (6, 3)})
    >>> windows, top
    ([0, 60], [('/', 7, [5, 2]), ('/cart', 4, [0, 4])])
    """
    windows = sorted({w for w, _ in stats})
    col = {w: i for i, w in enumerate(windows)}
    series: dict[str, list[int]] = {}
    for (w, page), (views, _) in stats.items():
        if page is not None:
            series.setdefault(page, [0] * len(windows))[col[w]] += views
    ranked = sorted(series.items(), key=lambda kv: (-sum(kv[1]), kv[0]))[:n]
    return windows, [(page, sum(s), s) for page, s in ranked]

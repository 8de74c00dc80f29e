"""A web shop's access log for the demo: Apache combined log lines, and the exact counts a
correct pipeline must find in them.

The traffic is what a log analyst expects to see, seeded so that a run repeats exactly:

- **pages** follow a Zipf-like law (a few pages get most views: the home page, search,
  the best sellers; a long tail of products, categories and blog posts), and searches and
  campaign links carry query strings (``/search?q=boots``, ``?utm_source=newsletter``);
- **visitors** follow a Zipf-like law too (a few heavy users, a long tail of one-visit
  people), each with one address and one browser;
- not every line is a page view: static assets, form posts (302), missing pages (404),
  server errors (5xx), search-engine crawlers and the load balancer's health checks are
  mixed in, as in a real log; :mod:`headwater.demo.stats` holds the rule that tells them
  apart, and this generator decides each line's kind first and writes the line to match;
- **event time** runs from :data:`START` for ``minutes`` minutes, busier towards the end of
  the morning, with a newsletter going out at 60% of the run that sends a burst of visitors
  to one product page; a line's timestamp is when its request arrived, and lines are
  written when requests finish (up to :data:`LATENESS_S_MAX` seconds later), so the log is
  only nearly in time order;
- after the traffic, the log goes on with :data:`TAIL_S` seconds of health checks only.
  They are no page views, but they move event time on: a streaming query closes a window
  only when its watermark, the latest time seen minus the allowed lateness, has passed
  the window's end; without a tail the last windows of a finite log would never close.

:class:`Truth` counts, while the lines are made, what the pipeline must compute: page
views per (minute, page), and the distinct visitors per minute and per (minute, page).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import random
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

__all__ = ["LogLine", "Truth", "generate", "check_settings", "START", "TAIL_S", "LATENESS_S_MAX", "WINDOW_S"]

START = datetime(2025, 3, 4, 9, 0, tzinfo=UTC)  # a Tuesday morning
WINDOW_S = 60  # the pipeline's windows: one minute of event time
LATENESS_S_MAX = 8  # a line is written at most this long after its own timestamp
TAIL_S = 150  # health checks only, after the traffic: moves event time past the last window
HEALTH_CHECK_EVERY_S = 5
HEALTH_PATH = "/healthz"
SITE = "https://shop.example.com"
CAMPAIGN_PAGE = "/products/spring-sale"

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_WEBKIT = "AppleWebKit/537.36 (KHTML, like Gecko)"
_SAFARI = "AppleWebKit/605.1.15 (KHTML, like Gecko)"
_BROWSERS = (
    f"Mozilla/5.0 (Windows NT 10.0; Win64; x64) {_WEBKIT} Chrome/122.0.0.0 Safari/537.36",
    f"Mozilla/5.0 (Macintosh; Intel Mac OS X 14_3) {_SAFARI} Version/17.3 Safari/605.1.15",
    f"Mozilla/5.0 (iPhone; CPU iPhone OS 17_3 like Mac OS X) {_SAFARI} Version/17.3 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (X11; Linux x86_64; rv:123.0) Gecko/20100101 Firefox/123.0",
    f"Mozilla/5.0 (Linux; Android 14; Pixel 8) {_WEBKIT} Chrome/122.0.0.0 Mobile Safari/537.36",
    f"Mozilla/5.0 (Windows NT 10.0; Win64; x64) {_WEBKIT} Chrome/122.0.0.0 Safari/537.36 Edg/122.0.0.0",
)
_CRAWLERS = (
    ("66.249.66.1", "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"),
    ("66.249.66.7", "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"),
    ("157.55.39.12", "Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)"),
)
_HEALTH_CHECKERS = ("10.0.0.11", "10.0.0.12")
_HEALTH_AGENT = "ELB-HealthChecker/2.0"
_ASSETS = (
    "/static/app.4f9c2e.js",
    "/static/app.4f9c2e.css",
    "/static/vendor.91ab03.js",
    "/img/logo.svg",
    "/img/hero-spring.jpg",
    "/favicon.ico",
    "/static/fonts/inter.woff2",
)
_SEARCHES = ("boots", "rain+jacket", "sneakers", "wool+socks", "backpack", "sale", "gift+card", "sandals")
_WORDS = (
    "alpine",
    "harbor",
    "meadow",
    "summit",
    "river",
    "canyon",
    "cedar",
    "coastal",
    "granite",
    "prairie",
    "tundra",
    "willow",
    "aurora",
    "basalt",
    "delta",
    "fjord",
)
_ITEMS = (
    "boots",
    "jacket",
    "socks",
    "backpack",
    "tent",
    "gloves",
    "scarf",
    "sneakers",
    "hat",
    "bottle",
    "lamp",
    "vest",
    "shorts",
    "hoodie",
    "sandals",
    "poncho",
)

# Kinds of line, with their share of the traffic; only "view" is a page view.
_KINDS = (("view", 0.74), ("asset", 0.13), ("post", 0.03), ("missing", 0.025), ("error", 0.005), ("crawler", 0.07))


@dataclass(frozen=True)
class LogLine:
    """One line of the log, with the key it is produced under (the client's address)."""

    key: bytes
    text: bytes


@dataclass
class Truth:
    """What a correct pipeline finds in the log: kept by the generator as it writes.

    Windows are keyed by their start, in seconds since the epoch. ``views`` counts page
    views per (window, page); ``visitors`` holds the distinct visitors per window and
    ``page_visitors`` per (window, page)."""

    lines: int = 0
    views: Counter = field(default_factory=Counter)
    visitors: defaultdict = field(default_factory=lambda: defaultdict(set))
    page_visitors: defaultdict = field(default_factory=lambda: defaultdict(set))
    kinds: Counter = field(default_factory=Counter)
    last_time_s: int | None = None

    def count(self, kind: str, time_s: int, visitor: str, page: str | None) -> None:
        self.lines += 1
        self.kinds[kind] += 1
        if self.last_time_s is None or time_s > self.last_time_s:
            self.last_time_s = time_s
        if page is not None:
            window = time_s - time_s % WINDOW_S
            self.views[(window, page)] += 1
            self.visitors[window].add(visitor)
            self.page_visitors[(window, page)].add(visitor)

    @property
    def total_views(self) -> int:
        return sum(self.views.values())

    def per_window(self) -> dict[int, tuple[int, int]]:
        """window start -> (page views, distinct visitors)."""
        views: Counter = Counter()
        for (window, _), n in self.views.items():
            views[window] += n
        return {w: (views[w], len(self.visitors[w])) for w in sorted(views)}

    def per_page(self) -> dict[tuple[int, str], tuple[int, int]]:
        """(window start, page) -> (page views, distinct visitors)."""
        return {k: (n, len(self.page_visitors[k])) for k, n in self.views.items()}


def _zipf_cumulative(n: int, s: float) -> list[float]:
    return list(itertools.accumulate(1.0 / (rank**s) for rank in range(1, n + 1)))


def _catalog(rng: random.Random) -> list[str]:
    """The shop's pages, most visited first."""
    products = sorted({f"/products/{rng.choice(_WORDS)}-{rng.choice(_ITEMS)}" for _ in range(400)})
    rng.shuffle(products)
    categories = [f"/category/{item}" for item in _ITEMS]
    blog = [f"/blog/{a}-{b}-guide" for a, b in zip(_WORDS, rng.sample(_ITEMS, len(_WORDS)))]
    head = ["/", "/search", "/products/alpine-boots", "/cart", "/category/jackets", "/account"]
    tail = [p for p in products + categories + blog + ["/help/returns", "/help/shipping", "/about"] if p not in head]
    rng.shuffle(tail)
    return head + tail[:2] + ["/checkout"] + tail[2:]


def _addresses(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct public-looking IPv4 addresses."""
    seen: set[int] = set()
    out = []
    while len(out) < n:
        a = rng.randrange(1 << 32)
        first = a >> 24
        if a in seen or first in (0, 10, 66, 127, 157) or first >= 224:
            continue
        seen.add(a)
        out.append(f"{first}.{(a >> 16) & 255}.{(a >> 8) & 255}.{a & 255}")
    return out


def _per_second(traffic: int, seconds: int) -> list[int]:
    """How many requests finish in each second: a morning ramp plus a newsletter burst,
    rounded so that the counts add up to ``traffic`` exactly (largest remainder)."""
    weights = [1.0 + 0.5 * t / seconds + _burst(t, seconds) for t in range(seconds)]
    total = sum(weights)
    exact = [traffic * w / total for w in weights]
    counts = [math.floor(x) for x in exact]
    rest = traffic - sum(counts)
    for t in sorted(range(seconds), key=lambda t: counts[t] - exact[t])[:rest]:
        counts[t] += 1
    return counts


def _burst(t: int, seconds: int) -> float:
    """Extra traffic from the newsletter, which goes out at 60% of the run."""
    since = t - int(0.6 * seconds)
    return 0.0 if since < 0 else 1.5 * math.exp(-since / 45.0)


@functools.lru_cache(maxsize=64)
def _clf_time(epoch_s: int) -> str:
    """``04/Mar/2025:09:00:00 +0000``, the combined log format's time."""
    d = datetime.fromtimestamp(epoch_s, UTC)
    return f"{d.day:02d}/{_MONTHS[d.month - 1]}/{d.year}:{d.hour:02d}:{d.minute:02d}:{d.second:02d} +0000"


def check_settings(events: int, minutes: int) -> int:
    """Raise ValueError unless ``events`` lines can fill ``minutes`` of traffic; returns
    how many of them are health checks."""
    if minutes < 1:
        raise ValueError("minutes must be at least 1")
    checks = len(range(0, minutes * 60 + TAIL_S, HEALTH_CHECK_EVERY_S)) * len(_HEALTH_CHECKERS)
    if events < checks + minutes * 60:
        raise ValueError(
            f"{events} events are too few for {minutes} minutes of traffic (at least {checks + minutes * 60})"
        )
    return checks


class _Shop:
    """The seeded randomness of one log: the shop's pages, its visitors, and how each kind
    of request looks in the log."""

    def __init__(self, events: int, seconds: int, seed: int) -> None:
        self.rng = rng = random.Random(seed)
        self.start = int(START.timestamp())
        self.seconds = seconds
        self.pages = _catalog(rng)
        self.page_cum = _zipf_cumulative(len(self.pages), 1.1)
        self.visitors = _addresses(rng, max(100, events // 12))
        self.visitor_cum = _zipf_cumulative(len(self.visitors), 0.75)
        self.agents = {v: _BROWSERS[i % len(_BROWSERS)] for i, v in enumerate(self.visitors)}

    def page(self) -> str:
        return self.pages[bisect.bisect(self.page_cum, self.rng.random() * self.page_cum[-1])]

    def visitor(self) -> str:
        return self.visitors[bisect.bisect(self.visitor_cum, self.rng.random() * self.visitor_cum[-1])]

    def request(self, now: int, kind: str) -> tuple[str, str, int, str | None]:
        """(address, line, timestamp, the page if it is a page view) of one request of
        ``kind`` that finished at ``now``."""
        rng = self.rng
        lateness = 0 if rng.random() < 0.85 else rng.randint(1, LATENESS_S_MAX)
        at = max(self.start, now - lateness)  # the site opened at START
        size = rng.randint(800, 48_000)
        referer = "-"
        if kind == "crawler":
            ip, agent = rng.choice(_CRAWLERS)
            return ip, _line(ip, at, "GET", self.page(), 200, size, "-", agent), at, None
        ip = self.visitor()
        page = None
        method, status = "GET", 200
        if kind == "view":
            t = now - self.start
            burst = _burst(t, self.seconds)
            if burst and rng.random() < burst / (1.0 + 0.5 * t / self.seconds + burst):
                page, target = CAMPAIGN_PAGE, CAMPAIGN_PAGE + "?utm_source=newsletter"
            else:
                page = self.page()
                target = f"/search?q={rng.choice(_SEARCHES)}" if page == "/search" else page
                if rng.random() < 0.6:
                    referer = SITE + self.page()
                elif rng.random() < 0.5:
                    referer = "https://www.google.com/"
        elif kind == "asset":
            target, status, referer = rng.choice(_ASSETS), rng.choice((200, 200, 304)), SITE + "/"
        elif kind == "post":
            target, method, status, size = rng.choice(("/cart/add", "/login", "/checkout")), "POST", 302, 0
        elif kind == "missing":
            target, status = f"/products/{rng.choice(_WORDS)}-{rng.choice(_WORDS)}", 404
        else:  # a server error
            target, status = rng.choice(("/checkout", "/cart", "/search?q=boots")), rng.choice((500, 503))
        return ip, _line(ip, at, method, target, status, size, referer, self.agents[ip]), at, page


def generate(events: int, *, minutes: int = 10, seed: int = 5, truth: Truth | None = None) -> Iterator[list[LogLine]]:
    """The lines of the log, one list per second of it, ``events`` lines in all (health
    checks included); ``truth`` counts them as they are made."""
    checks = check_settings(events, minutes)
    seconds = minutes * 60
    truth = truth if truth is not None else Truth()
    shop = _Shop(events, seconds, seed)
    kinds = [k for k, _ in _KINDS]
    kind_cum = list(itertools.accumulate(share for _, share in _KINDS))
    per_second = _per_second(events - checks, seconds)
    for t in range(seconds + TAIL_S):
        now = shop.start + t
        chunk: list[LogLine] = []
        if t < seconds:
            for kind in shop.rng.choices(kinds, cum_weights=kind_cum, k=per_second[t]):
                ip, text, at, page = shop.request(now, kind)
                truth.count(kind, at, ip, page)
                chunk.append(LogLine(ip.encode(), text.encode()))
        if t % HEALTH_CHECK_EVERY_S == 0:
            for ip in _HEALTH_CHECKERS:
                truth.count("health", now, ip, None)
                text = _line(ip, now, "GET", HEALTH_PATH, 200, 2, "-", _HEALTH_AGENT)
                chunk.append(LogLine(ip.encode(), text.encode()))
        if chunk:
            yield chunk


def _line(ip: str, at: int, method: str, target: str, status: int, size: int, referer: str, agent: str) -> str:
    return (
        f'{ip} - - [{_clf_time(at)}] "{method} {target} HTTP/1.1" {status} '
        f'{size if size else "-"} "{referer}" "{agent}"'
    )

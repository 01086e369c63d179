"""Prometheus metrics of every role, in the process's default registry.

The front serves them at ``/metrics`` on its HTTP port; a role running alone
(``acp-broker worker agent-host`` / ``projector``) serves them on its own port
(setting ``metrics_port``). Names follow Prometheus' conventions: ``_total`` for counters,
``_seconds`` and ``_bytes`` for units. Request latency is labelled by method (the ACP
methods the broker knows; anything else is ``other``, so a client cannot grow the label
set) and outcome (``ok``, ``error``, ``timeout``).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    Counter,
    Gauge,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

METRICS_PATH = "/metrics"


class Tally(Collector):
    """A counter bumped once per frame sent, exported as a Prometheus counter.

    prometheus_client's ``Counter.inc`` takes a lock and checks its labels: two of them per
    frame were 0.6 µs of a fan-out's ~2 µs per connection. Frames are sent on the event
    loop's thread only, so a plain integer does.
    """

    def __init__(self, name: str, documentation: str) -> None:
        self.name = name.removesuffix("_total")
        self.documentation = documentation
        self.value = 0
        REGISTRY.register(self)

    def inc(self, amount: int = 1) -> None:
        self.value += amount

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self.name, self.documentation, value=self.value)


class _Series:
    """One histogram's counts, observed on the event loop's thread only: a bisection and two
    additions an observation."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, float]]:
        """The buckets as Prometheus exposes them: (upper bound, observations at most it)."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append((floatToGoString(bound), running))
        return out


Series = _Series
"""One histogram's series, for a caller that keeps it (see :func:`request_seconds`)."""


class LoopHistogram(Collector):
    """A histogram observed on the event loop's thread only, exported as a Prometheus one.

    prometheus_client's ``Histogram.observe`` takes a lock and walks the buckets in Python:
    once per event, with ``Counter.inc`` beside it, they were ~6% of a front's CPU fanning a
    thousand sessions out to two watchers each (py-spy, ``bench fanout`` S=1000/W=2). A
    bisection and two additions do here.
    """

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self._series = _Series(tuple(sorted(buckets)))
        self.observe = self._series.observe
        REGISTRY.register(self)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        series = self._series
        yield HistogramMetricFamily(
            self.name, self.documentation, buckets=series.cumulative(), sum_value=series.sum
        )


class LoopHistograms(Collector):
    """:class:`LoopHistogram` with labels: a series per set of label values (made on first
    use: :meth:`labels`), exported as one Prometheus histogram family.

    The request histograms (``acp_broker_request_seconds``, ``_list_seconds``) were
    prometheus_client's: two ``observe`` a request, each with its locks and its walk of
    the buckets, were 10% of an uncached front's GIL samples under ``session/list``
    (py-spy, ``bench list``), where the bare server beside it (``redis_ws``) has none.
    """

    def __init__(
        self, name: str, documentation: str, labelnames: tuple[str, ...], buckets: tuple[float, ...]
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.bounds = tuple(sorted(buckets))
        self._series: dict[tuple[str, ...], _Series] = {}
        REGISTRY.register(self)

    def labels(self, *values: str) -> _Series:
        """The series of these label values (one for each of :attr:`labelnames`, in order)."""
        series = self._series.get(values)
        if series is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes the labels {self.labelnames}")
            series = self._series[values] = _Series(self.bounds)
        return series

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, series in list(self._series.items()):
            family.add_metric(list(values), series.cumulative(), series.sum)
        yield family


LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# -- front: connections, fan-out, requests --------------------------------------------------
CONNECTIONS = Gauge("acp_broker_connections", "Client WebSocket connections open on this node")
SESSIONS_ACTIVE = Gauge(
    "acp_broker_sessions_active", "Sessions active on at least one connection of this node"
)
FRAMES_SENT = Tally("acp_broker_frames_sent_total", "WebSocket frames sent to clients")
BYTES_SENT = Tally("acp_broker_sent_bytes_total", "Bytes of WebSocket frames sent to clients")
EVENTS_DELIVERED = Tally(
    "acp_broker_events_delivered_total", "Session events handed to client connections"
)
FANOUT_LAG = LoopHistogram(
    "acp_broker_fanout_lag_seconds",
    "From an event's append to its delivery to this node's connections",
    LATENCY_BUCKETS,
)
CATCH_UP_READS = Counter(
    "acp_broker_catch_up_reads_total", "Log reads that filled a gap pub/sub left (or lost)"
)
REQUESTS = LoopHistograms(
    "acp_broker_request_seconds",
    "Client requests by method and outcome (ok, error, timeout)",
    ("method", "outcome"),
    LATENCY_BUCKETS,
)
LIST_SECONDS = LoopHistograms(
    "acp_broker_list_seconds",
    "Session listings (ACP session/list, REST /v1/sessions, MCP session_list)",
    ("api",),
    LATENCY_BUCKETS,
)
PAGE_CACHE = Counter(
    "acp_broker_page_cache_total",
    "List pages asked of the front's page cache, by outcome: hit, miss, bypass (not subscribed)",
    ["outcome"],
)
PAGE_CACHE_INVALIDATIONS = Counter(
    "acp_broker_page_cache_invalidations_total",
    "Tenants' cached pages dropped: an index change announced, or made by this front",
)
PAGE_CACHE_RESETS = Counter(
    "acp_broker_page_cache_resets_total",
    "Times the page cache was emptied and bypassed because its subscription was lost",
)
PAGE_CACHE_LIVE = Gauge(
    "acp_broker_page_cache_live", "1 while the page cache is subscribed and serving pages"
)
LIST_CHANGES_SENT = Counter(
    "acp_broker_list_changes_sent_total",
    "_acpBroker/session/list_changed notifications sent to the connections that asked for them",
)
REFUSED = Counter(
    "acp_broker_requests_refused_total", "Requests refused by a rate limit", ["limit"]
)
CLOSES = Counter("acp_broker_closes_total", "Connections the broker closed, by reason", ["reason"])

# -- agent host -----------------------------------------------------------------------------
EVENTS_APPENDED = Counter("acp_broker_events_appended_total", "Events appended to session logs")
AGENT_PROCESSES = Gauge("acp_broker_agent_processes", "Agent processes running on this host")
AGENT_STARTS = Counter(
    "acp_broker_agent_starts_total", "Agent processes started (the first and every restart)"
)
LEASES_HELD = Gauge("acp_broker_leases_held", "Sessions this agent host holds by lease")
LEASES_TAKEN_OVER = Counter(
    "acp_broker_leases_taken_over_total", "Sessions taken over from agent hosts that died"
)
UPDATES_WAITING = Gauge(
    "acp_broker_updates_waiting", "Agent updates waiting for the store (kept while it is away)"
)

# -- projector ------------------------------------------------------------------------------
PROJECTED = Counter("acp_broker_projected_total", "Sessions projected into the index")
SESSIONS_HOT = Gauge(
    "acp_broker_sessions_hot", "Sessions whose log is in Redis (the projector's last count)"
)
SESSIONS_ARCHIVED = Gauge(
    "acp_broker_sessions_archived",
    "Sessions whose log is in the archive store only (the projector's last count)",
)
PROJECTOR_BACKLOG = Gauge(
    "acp_broker_projector_backlog", "Change notices not yet read by the projectors (feed lag)"
)

# -- Redis ----------------------------------------------------------------------------------
LOG_REWINDS = Counter(
    "acp_broker_log_rewinds_total",
    "Session logs found behind a seq already acknowledged or delivered (Redis lost "
    "acknowledged writes in a failover), by who found it: append, fanout",
    ["found_by"],
)
REDIS_ERRORS = Counter(
    "acp_broker_redis_errors_total", "Failed Redis operations of the retrying loops", ["loop"]
)
REDIS_RECOVERIES = Counter(
    "acp_broker_redis_reconnects_total",
    "Loops that got Redis back after failing (pub/sub: each new subscription connection)",
    ["loop"],
)

STORE_USED = Gauge("acp_broker_store_used_bytes", "Redis used_memory (at the last readiness check)")
STORE_LIMIT = Gauge("acp_broker_store_maxmemory_bytes", "Redis maxmemory (0: no limit)")
STORE_FULL = Gauge("acp_broker_store_full", "1 while Redis is at maxmemory (writes are refused)")
STORE_AWAY = Gauge(
    "acp_broker_store_away", "1 while this process knows Redis is away (requests fail fast)"
)
WRITES_REFUSED = Counter(
    "acp_broker_writes_refused_total",
    "Writes refused for a store failure, by reason (store_full, session_full, tenant_full)",
    ["reason"],
)

KNOWN_METHODS = frozenset(
    {
        "initialize",
        "authenticate",
        "session/new",
        "session/load",
        "session/resume",
        "session/list",
        "session/prompt",
        "session/cancel",
        "session/close",
        "session/delete",
        "session/set_mode",
        "session/set_model",
        "session/set_config_option",
        "session/set_title",
        "auth/login",
        "auth/logout",
    }
)


def request_seconds(method: str, outcome: str) -> _Series:
    """:data:`REQUESTS` of one method (as :func:`method_label` names it) and outcome."""
    return _request_seconds(method_label(method), outcome)


@functools.lru_cache(maxsize=256)
def _request_seconds(label: str, outcome: str) -> _Series:
    # Kept: a lookup by a tuple of labels is a dict's, made once.
    return REQUESTS.labels(label, outcome)


@functools.lru_cache(maxsize=16)
def list_seconds(api: str) -> _Series:
    """:data:`LIST_SECONDS` of one API, kept as :func:`request_seconds` is."""
    return LIST_SECONDS.labels(api)


def method_label(method: str) -> str:
    """``method`` as a label value: itself when the broker knows it, else ``other``."""
    return method if method in KNOWN_METHODS else "other"


def exposition() -> tuple[bytes, str]:
    """The metrics in Prometheus' text format, and its content type."""
    return generate_latest(), CONTENT_TYPE_LATEST

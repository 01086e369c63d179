"""The Grafana dashboard in deploy/grafana loads: a dashboard document of the shape Grafana
imports, every panel on the grid with a Prometheus query, and every metric it queries one
the broker exports (a renamed metric would leave a panel empty)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import REGISTRY

import broker.ops.metrics  # noqa: F401 - registers the metrics

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "acp-broker.json"
_METRIC = re.compile(r"\bacp_broker_[a-z_]+")


def exported_names() -> set[str]:
    """Every series name the registry can export (a labelled metric has no sample before its
    first label set, so the names come from each family's type)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
    names: set[str] = set()
    for family in REGISTRY.collect():
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert isinstance(dashboard["title"], str) and dashboard["title"]
    assert isinstance(dashboard["uid"], str) and len(dashboard["uid"]) <= 40
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 30
    panels = dashboard["panels"]
    assert len(panels) >= 10
    assert len({p["id"] for p in panels}) == len(panels), "panel ids repeat"
    for panel in panels:
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("h", "w", "x", "y")), panel["title"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["type"] in {"timeseries", "stat", "gauge", "table"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["type"] == "prometheus"
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in _METRIC.findall(target["expr"])
    }
    missing = queried - exported_names()
    assert not missing, missing
    # And each of the metric groups has a panel.
    for needed in (
        "acp_broker_connections",
        "acp_broker_fanout_lag_seconds_bucket",
        "acp_broker_projector_backlog",
        "acp_broker_redis_errors_total",
        "acp_broker_leases_taken_over_total",
    ):
        assert needed in queried, needed

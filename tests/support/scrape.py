"""A ``/metrics`` page read as a test reads it: with ``prometheus_client``'s own parser."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""Every sample of a page, by name and sorted labels."""


def samples(exposition: str) -> Samples:
    """Every sample of a ``/metrics`` page, by name and labels."""
    found: Samples = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def total(found: dict[Any, float], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in found.items() if n == name and wanted <= set(ls))

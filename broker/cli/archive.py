"""``acp-broker archive`` and ``acp-broker purge``: the archiving role's rounds, run once by
an operator, with a dry run first and progress on long runs."""

from __future__ import annotations

import argparse
import sys
import time

from ..config import Settings

PROGRESS_EVERY = 100
"""Sessions between two progress lines."""


def add_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
) -> list[argparse.ArgumentParser]:
    """The two commands' parsers (the caller adds the common options)."""
    archive = sub.add_parser(
        "archive", help="move idle sessions' logs from Redis to the archive store"
    )
    archive.add_argument(
        "--older-than",
        type=float,
        metavar="SECONDS",
        help="archive sessions idle this long (default: the archive_after setting)",
    )
    purge = sub.add_parser("purge", help="purge deleted sessions past their retention")
    purge.add_argument(
        "--older-than",
        type=float,
        metavar="SECONDS",
        help="purge sessions deleted this long ago (default: the deleted_retention setting)",
    )
    for parser in (archive, purge):
        parser.add_argument("--archive-store", help="dir:PATH, PATH or postgresql://…")
        parser.add_argument("--dry-run", action="store_true", help="only count what would be done")
    return [archive, purge]


async def run(settings: Settings, command: str, older_than: float | None, dry_run: bool) -> int:
    """One archive or purge round over every partition; prints progress and a summary."""
    from workers.projector.archiving import Archiver, RoundOutcome

    from ..store.archive import open_archive
    from ..store.client import connect

    location = settings.archive_location()
    if settings.redis_url is None or location is None:
        print(
            f"acp-broker {command}: --redis-url and --archive-store are required", file=sys.stderr
        )
        return 2
    redis = connect(settings.redis_url)
    archive = open_archive(location)
    started = time.monotonic()

    def progress(outcome: RoundOutcome) -> None:
        done = outcome.sessions + outcome.skipped
        if done % PROGRESS_EVERY == 0:
            print(f"… {done} sessions, {outcome.events} events", file=sys.stderr, flush=True)

    try:
        archiver = Archiver(redis, archive)
        if command == "archive":
            age = settings.archive_after if older_than is None else older_than
            if age is None:
                print(
                    "acp-broker archive: archive_after is unset; give --older-than", file=sys.stderr
                )
                return 2
            outcome = await archiver.archive_round(age, dry_run=dry_run, progress=progress)
            verb = "would archive" if dry_run else "archived"
            print(
                f"{verb} {outcome.sessions} sessions ({outcome.events} events), "
                f"skipped {outcome.skipped}, in {time.monotonic() - started:.1f}s"
            )
        else:
            age = settings.deleted_retention if older_than is None else older_than
            outcome = await archiver.purge_round(age, dry_run=dry_run, progress=progress)
            verb = "would purge" if dry_run else "purged"
            print(f"{verb} {outcome.sessions} deleted sessions, skipped {outcome.skipped}")
    finally:
        await archive.close()
        await redis.aclose()
    return 0

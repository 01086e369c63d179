"""Secrets given as command-line flags: they still work, and are warned about once.

Any local user reads any process's command line (``/proc/<pid>/cmdline``, ``ps``): a
Redis URL with a password, a cursor secret or a token given as a flag is as good as
published on that machine. Files (``--redis-url-file``, ``--cursor-secret-file``,
``--token-file``), ``ACP_BROKER_*`` variables (``*_FILE`` ones too) and the TOML file
keep them off it.
"""

from __future__ import annotations

import argparse
import logging
from urllib.parse import urlsplit

log = logging.getLogger("acp-broker")

_warned: set[str] = set()


def secret_flags(args: argparse.Namespace) -> list[str]:
    """The flags of ``args`` that carry a secret on the command line."""
    flags = []
    url = getattr(args, "redis_url", None)
    if url and _has_password(url):
        flags.append("--redis-url (its password)")
    if getattr(args, "cursor_secret", None):
        flags.append("--cursor-secret")
    if getattr(args, "token", None):
        flags.append("--token")
    return flags


def warn_about_secret_flags(args: argparse.Namespace) -> None:
    """Warn, once per flag and process, that a secret was given on the command line."""
    for flag in secret_flags(args):
        if flag in _warned:
            continue
        _warned.add(flag)
        log.warning(
            "a secret given as %s is readable by any local user (/proc/<pid>/cmdline, ps): "
            "give it in a file (--redis-url-file, --cursor-secret-file, --token-file), an "
            "ACP_BROKER_* variable or the TOML file",
            flag,
        )


def _has_password(url: str) -> bool:
    try:
        return bool(urlsplit(url).password)
    except ValueError:
        return False

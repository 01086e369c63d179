"""Store URLs: which topology each scheme names, the TLS files they point at, and the URL
as it may be shown (every secret masked).

Kept free of any client library: the logging module masks URLs in every line with it.
"""

from __future__ import annotations

import os
import re
from urllib.parse import parse_qsl, urlsplit

SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}
"""The Sentinel schemes, and whether each speaks TLS."""

TLS_FILE_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_ca_path")
"""URL options that name a file (or, ``ssl_ca_path``, a folder) TLS reads when it connects."""


def tls_files_exist(url: str) -> None:
    """Raise FileNotFoundError naming the file when an option of ``url`` names a TLS file
    that does not exist (the TLS layer would say only "No such file or directory", later)."""
    for name, value in parse_qsl(urlsplit(url).query):
        if name in TLS_FILE_OPTIONS and not os.path.exists(value):
            raise FileNotFoundError(f"the store URL's {name} names {value!r}, which does not exist")


_SECRET_OPTION = re.compile(r"pas|pw|secret|token|auth|cred", re.IGNORECASE)
"""URL options whose values are masked: ``password``, ``sentinel_password``,
``ssl_password`` and the like, misspelt ones included (``pasword``, ``passwd``)."""


def masked_url(url: str | None) -> str:
    """A store URL fit for a log, an error or a health answer: the password of its user
    info and the value of every option that holds a secret (``?password=``,
    ``sentinel_password=`` …) replaced by ``***`` ("embedded" for None). Works on the
    Sentinel form too, whose host part lists several ``HOST:PORT``."""
    if url is None:
        return "embedded (in-process, not durable)"
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    rest, hashed, fragment = rest.partition("#")
    rest, asked, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        userinfo, hosts = netloc.rsplit("@", 1)
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:***@{hosts}" if colon else netloc
    options = [_masked_option(item) for item in query.split("&")] if asked else []
    return f"{scheme}://{netloc}{slash}{path}{asked}{'&'.join(options)}{hashed}{fragment}"


def _masked_option(item: str) -> str:
    name, equals, _ = item.partition("=")
    return f"{name}=***" if equals and _SECRET_OPTION.search(name) else item

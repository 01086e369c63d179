"""The one settings object, read from flags, the environment and an optional TOML file.

Precedence, highest first: command-line flags, ``ACP_BROKER_*`` environment
variables, the TOML file named by ``--config`` (or ``ACP_BROKER_CONFIG``),
then the defaults below.
"""

from __future__ import annotations

import logging
import os
import secrets
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from .store.names import TENANT_RULE, is_tenant

log = logging.getLogger(__name__)

AGENT_META_KEY = "acpBroker/agent"
"""``_meta`` key of ``session/new`` that picks the agent by name."""
KIND_META_KEY = "acpBroker/kind"
"""``_meta`` key of ``session/new`` that overrides the session's kind."""

SESSION_KINDS = ("browser", "shell", "combined")
BROKER_COMMAND = "acp-broker"
"""An agent command that starts with this runs this installation's ``acp-broker``."""
HS256_KEY_BYTES = 32
"""The shortest ``jwt_secret`` accepted: an HS256 key as long as its hash (RFC 7518, 3.2)."""

DEFAULT_AGENT_ENV = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TMPDIR",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "ACP_DEMO_*",
)
"""What agents get of the broker's environment by default: what a program needs to run,
nothing secret (see the setting ``agent_env``)."""


class AgentSpec(BaseModel):
    """One agent behind the broker: a command that speaks ACP over stdio."""

    name: str
    command: list[str]
    kind: str = "combined"
    env: dict[str, str] = Field(default_factory=dict)
    sandbox: bool | None = None
    """Run this agent sealed (True: refuse to run it unsealed), unsealed (False: a
    single-user laptop), or as the host's ``sandbox`` setting says (None)."""
    network: bool = True
    """Whether a sealed agent reaches the network (an agent that calls a model API must)."""
    ro_paths: list[str] = Field(default_factory=list)
    """More paths a sealed agent sees read-only (its own installation, ``~/.config/…``)."""
    rw_paths: list[str] = Field(default_factory=list)
    """More paths a sealed agent may write (a cache, a credentials store it refreshes)."""
    process_per: Literal["tenant", "session"] = "tenant"
    """One process per tenant (and working directories, when sealed), or per session."""

    @field_validator("command", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return shlex.split(value) if isinstance(value, str) else value

    @field_validator("command")
    @classmethod
    def _not_empty(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("an agent needs a command")
        if value[0] == BROKER_COMMAND:
            # This installation's own command, whatever PATH holds (a virtual environment
            # need not be activated for ``acp-broker demo-agent`` to start).
            return [sys.executable, "-m", "broker.cli", *value[1:]]
        return value

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        if value not in SESSION_KINDS:
            raise ValueError(f"kind must be one of {', '.join(SESSION_KINDS)}")
        return value

    @field_validator("ro_paths", "rw_paths")
    @classmethod
    def _absolute(cls, value: list[str]) -> list[str]:
        for path in value:
            if not os.path.isabs(path):
                raise ValueError(f"a sandbox path must be absolute, got {path!r}")
        return [os.path.normpath(path) for path in value]

    @classmethod
    def parse(cls, text: str) -> AgentSpec:
        """``NAME=COMMAND ARGS…`` as given to ``--agent``."""
        name, sep, command = text.partition("=")
        if not sep or not name.strip() or not command.strip():
            raise ValueError(f"--agent takes NAME='COMMAND ARGS…', got {text!r}")
        return cls(name=name.strip(), command=command)  # type: ignore[arg-type]


def demo_agent() -> AgentSpec:
    """The demo agent shipped in the package; used when no agent is configured."""
    return AgentSpec(name="demo", command=[BROKER_COMMAND, "demo-agent"])


class Settings(BaseSettings):
    """Everything a broker process can be told."""

    model_config = SettingsConfigDict(env_prefix="ACP_BROKER_", extra="forbid")

    host: str = "127.0.0.1"
    port: int = 8765
    path: str = "/acp"
    http_port: int | None = Field(default=None, ge=0, le=65535)
    """MCP and REST listener; unset: ``port`` + 1 (8766), or any free port when ``port`` is 0."""
    redis_url: str | None = None
    agents: list[AgentSpec] = Field(default_factory=list)
    cursor_secret: str | None = None
    cursor_old_secrets: list[str] = Field(default_factory=list)
    tenant: str = "default"
    """The tenant everyone acts for when authentication is off."""
    prestart_agents: bool = True
    workers: bool = True
    lease_ttl: float = Field(default=10.0, gt=0)
    ack_timeout: float = Field(default=2.0, gt=0)
    drain_timeout: float = Field(default=10.0, ge=0)

    auth: Literal["auto", "on", "off"] = "auto"
    """auto: on whenever the broker listens beyond loopback."""
    allow_in_band_auth: bool = False
    """Accept upgrades without credentials, for clients that authenticate through ACP."""
    jwt_secret: str | None = None
    jwt_public_key_file: str | None = None
    jwt_jwks_file: str | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_tenant_claim: str = "tenant"
    jwt_roles_claim: str = "roles"
    """The JWT claim naming the session roles a token holds on its tenant's sessions."""
    jwt_leeway: float = Field(default=30.0, ge=0)
    """Seconds of clock skew allowed on a JWT's ``exp`` and ``nbf``."""
    jwt_default_scopes: list[Literal["read", "write", "admin"]] = ["read", "write"]
    """The scopes of a JWT that has neither a ``scope`` nor a ``scopes`` claim."""
    login_timeout: float = Field(default=10.0, gt=0)
    """Seconds a connection admitted without credentials (``allow_in_band_auth``) has to
    authenticate in band; then it is closed (4001), checked with the credentials."""
    credential_check_interval: float = Field(default=5.0, gt=0)
    """How often open connections' credentials are checked again: a revoked API token or an
    expired JWT is cut (close code 4001) within this many seconds."""
    sandbox: Literal["auto", "on", "off"] = "auto"
    """How agent processes are sealed (bubblewrap, ``bwrap``): ``auto`` seals them where
    ``bwrap`` works and says once, at start, that they run unsealed where it does not;
    ``on`` refuses to run an agent unsealed; ``off`` runs them unsealed. An agent spec's own
    ``sandbox`` wins."""
    sandbox_hidden_paths: list[str] = Field(default_factory=list)
    """More paths sealed agents must not see, on top of the configuration and secret files
    the broker knows of (a systemd ``EnvironmentFile`` under ``/etc``, a key store)."""
    sandbox_tmp_bytes: int = Field(default=256 * 1024 * 1024, ge=1024 * 1024)
    """The size of a sealed agent's private ``/tmp`` (a file system in memory)."""
    agent_idle_timeout: float | None = Field(default=1800.0, gt=0)
    """Seconds an agent process may go without a request or a message before it is
    stopped (its sessions recorded STOPPED: a prompt or a resume brings them back); None:
    never."""
    max_agent_processes: int = Field(default=256, ge=1)
    """The most agent processes an agent host runs at once (a process per agent and tenant,
    and per set of directories when sealed); a session that needs one more is refused
    (-32005) until an idle one is stopped."""
    redis_url_file: str | None = None
    """A file holding ``redis_url`` (keeps the password off command lines)."""
    jwt_secret_file: str | None = None
    """A file holding ``jwt_secret``."""
    cursor_secret_file: str | None = None
    """A file holding ``cursor_secret``."""
    agent_env: list[str] = Field(default_factory=lambda: list(DEFAULT_AGENT_ENV))
    """The broker's environment variables an agent process gets (``NAME`` or ``PREFIX*``);
    ``ACP_BROKER_*`` never, whatever this says. An agent spec's own ``env`` comes on top."""
    allowed_origins: list[str] = Field(default_factory=list)
    """Browser origins allowed to open the WebSocket and call REST (empty: no browsers; the
    console's own origin is always allowed to open the WebSocket)."""
    console_ws_url: str | None = None
    """The WebSocket URL the web console at ``/`` opens (unset: worked out per request)."""
    public_url: str | None = None
    """The deployment's public base URL (``https://broker.example.com``, the load balancer's
    address): the base of the live view URLs the session tools hand out (unset: the address
    the request came to; over stdio, this node's HTTP port)."""
    tls_cert: str | None = None
    tls_key: str | None = None

    max_connections: int = Field(default=10_000, ge=1)
    max_connections_per_token: int = Field(default=200, ge=1)
    max_sessions_per_connection: int = Field(default=100, ge=1)
    rate_per_connection: float = Field(default=50.0, gt=0)
    """Requests per second a connection is served (bursts up to twice as many); a faster
    client is slowed down (its socket is not read meanwhile), not refused."""
    rate_per_token: float = Field(default=200.0, gt=0)
    """Requests per second all of a credential's connections, on every node, are served
    together (counted in Redis)."""
    max_pace: float = Field(default=5.0, ge=0)
    """Seconds a frame may wait for room in its credential's budget before its requests are
    refused (-32005)."""
    max_requests_in_flight: int = Field(default=256, ge=1)
    """Unanswered requests a connection may have at once; one more is refused (-32005)."""

    max_batch_entries: int = Field(default=100, ge=1)
    """Entries a JSON-RPC batch (ACP v2) may hold; a longer one is refused whole (-32600)."""
    http_header_timeout: float = Field(default=10.0, gt=0)
    """Seconds the HTTP listener waits for a request head (from connect, or the last
    response) before it closes the socket."""
    http_keep_alive_timeout: int = Field(default=5, ge=1)
    """Seconds the HTTP listener keeps an idle keep-alive connection open."""
    http_idle_timeout: float = Field(default=600.0, gt=0)
    """Seconds a Streamable HTTP connection nobody uses (no POST, no GET stream open) is
    kept; then it expires with its state (its sessions live on)."""
    http_lease: float = Field(default=5.0, gt=0)
    """Seconds a front that stopped (a crash) keeps the Streamable HTTP connections it ran,
    before another front takes them over at their next request."""
    http_retained_messages: int = Field(default=2_000, ge=16)
    """Messages each stream of a Streamable HTTP connection keeps for a client that resumes
    (``Last-Event-ID``); one further back is told 409."""
    http_heartbeat: float = Field(default=15.0, gt=0)
    """Seconds between the comment lines an idle SSE stream is sent (proxies keep it open)."""
    http_poll_interval: float = Field(default=1.0, gt=0)
    """Seconds an SSE stream waits for its bell before it looks in the store by itself
    (pub/sub may lose a bell)."""
    http_write_timeout: float = Field(default=10.0, gt=0)
    """Seconds an SSE stream may wait for its client to read before it is cut (the client
    resumes from its last event id)."""

    list_page_size: int = Field(default=50, ge=1, le=1000)
    list_cache: bool = True
    """Whether a front keeps the list pages it answered (``session/list``, REST, MCP) and
    answers them again from memory until the index announces a change of their tenant
    (``broker/front/pages.py``)."""
    list_cache_pages: int = Field(default=1024, ge=1)
    """The most pages a front's list cache holds (least recently used dropped first)."""
    list_cache_refresh: bool = True
    """Whether a front reads a page asked for lately again when its tenant's announcement
    drops it (so that the next ask is a hit); False: dropped only."""
    max_frame_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    max_message_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    max_json_depth: int = Field(default=64, ge=4)
    max_queue_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    ping_interval: float = Field(default=20.0, gt=0)
    agent_request_timeout: float = Field(default=60.0, gt=0)
    cancel_grace: float = Field(default=10.0, gt=0)
    feed_maxlen: int = Field(default=100_000, ge=1000)
    feed_trim_interval: float = Field(default=30.0, gt=0)
    """Seconds between two trims of the change feeds behind the projectors' group."""
    projector_claim_idle: float = Field(default=30.0, gt=0)
    """Seconds a notice may sit read but unacknowledged by one projector before another takes
    it over: how long a killed projector's last batch waits. Shorter takes over sooner, but
    a projector slower than this on one batch sees it projected twice (harmless: projection
    is idempotent, only wasted work)."""
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    """The event loop ``serve`` and the workers run on (see :mod:`broker.loops`)."""

    archive_store: str | None = None
    """Where idle sessions' logs go: a folder (``dir:PATH`` or ``PATH``) or PostgreSQL
    (``postgresql://…``). Unset: a private temporary folder on the embedded store, and no
    archiving on Redis (see :meth:`archive_location`)."""
    archive_after: float | None = Field(default=3600.0, gt=0)
    """Seconds without an append after which a session's log is archived (None: never)."""
    archive_interval: float = Field(default=60.0, gt=0)
    """Seconds between two rounds of the archiving role (archive, then purge)."""
    deleted_retention: float = Field(default=7 * 86400.0, ge=0)
    """Seconds a deleted session is kept (listed as DELETED) before it is purged."""
    operation_retention: float = Field(default=86400.0, gt=0)
    """Seconds an operation id's outcome (ACP ``operationId``, REST ``Idempotency-Key``, an
    MCP tool's ``operationId``) is kept from its first request: a retry within it gets that
    outcome."""
    operation_tombstone: float = Field(default=7 * 86400.0, ge=0)
    """Seconds past the retention an operation id is still known as used: a retry then gets
    ``operation_outcome_unknown`` rather than running again (0: forgotten at once)."""
    max_events_per_session: int = Field(default=200_000, ge=10)
    """The most events one session's log may hold; past it appends fail (a runaway agent)."""
    max_sessions_per_tenant: int = Field(default=100_000, ge=1)
    """The most sessions (deleted ones until purged included) one tenant may have."""
    # Deadlines (seconds): every request is answered or failed within its own.
    request_timeout: float = Field(default=30.0, gt=0)
    """A client request other than a prompt (session/new, load, list, REST, MCP…)."""
    prompt_timeout: float = Field(default=3600.0, gt=0)
    """A whole prompt turn, permission questions included."""
    redis_timeout: float = Field(default=5.0, gt=0)
    """One Redis command (a stalled Redis fails it, and it is tried again or reported)."""
    allow_evicting_store: bool = False
    """Run on a Redis whose ``maxmemory-policy`` is not ``noeviction`` (refused otherwise: a
    full Redis would drop sessions' logs silently); a warning is logged every minute."""
    redis_wait_replicas: int = Field(default=0, ge=0)
    """Appends wait until this many replicas acknowledged them (Redis ``WAIT``), so that an
    acknowledged event survives the loss of the master; 0: no waiting."""
    redis_wait_timeout: float = Field(default=1.0, gt=0)
    """Seconds an append waits for its replicas (then it fails, as not durable)."""
    client_request_timeout: float = Field(default=600.0, gt=0)
    """An agent's question to a client (a permission a person decides on, fs/*, terminal/*)."""
    client_reask_interval: float = Field(default=5.0, gt=0)
    """How often an unanswered agent question is asked again (same id: never twice a person)."""
    client_reconnect_grace: float = Field(default=30.0, ge=0)
    """How long an agent question whose client went away (its node stopped, its connection
    dropped) waits for a client that resumes the session (the stdio bridge, the console)
    before it fails; one no connection could ever answer fails at once."""
    answer_timeout: float = Field(default=30.0, gt=0)
    """How long a front keeps trying to hand a client's answer to the agent host."""
    presence_ttl: float = Field(default=15.0, gt=0)
    """Seconds a front's presence entry lives unless the front refreshes it (it does every
    third of this): a killed front's attachments leave presence within this."""
    presence_idle_after: float = Field(default=300.0, gt=0)
    """Seconds without a request on a session after which its attachment shows ``away``."""
    attach_barrier_timeout: float = Field(default=30.0, gt=0)
    """Seconds a ``session/attach`` waits for its ``session/ready`` before it expires."""
    attach_buffer_events: int = Field(default=10_000, ge=16)
    """Events an attachment buffers until its ``session/ready``; past that it expires."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """Where a role running alone (``worker agent-host``/``projector``) serves ``/metrics``,
    ``/livez`` and ``/readyz`` (0: any free port; unset: nowhere). ``serve`` uses its HTTP
    port."""
    health_timeout: float = Field(default=2.0, gt=0)
    """Each readiness check of ``/readyz`` (a write probe of the store, pub/sub, loops)
    within this."""
    max_pending_updates: int = Field(default=10_000, ge=16)
    """Agent updates an agent host keeps, in order, while the store is unreachable; past
    that their sessions are failed (an error event once the store is back, and in the log)."""

    _config_path: str | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _secret_files(cls, values: Any) -> Any:
        """``NAME_file`` settings: the secret read from the file, unless given itself."""
        if not isinstance(values, dict):
            return values
        for name in SECRET_FILE_SETTINGS:
            path = values.get(f"{name}_file")
            if path and values.get(name) is None:
                values = {**values, name: read_secret_file(str(path), f"{name}_file")}
        return values

    @field_validator("jwt_secret")
    @classmethod
    def _hs256_key_length(cls, value: str | None) -> str | None:
        # A short HS256 secret can be found by brute force from any one token it signed,
        # and then any tenant's tokens forged: RFC 7518 (3.2) requires a key at least as
        # long as the hash, 32 bytes; refusing to start beats accepting it quietly.
        if value is not None and len(value.encode()) < HS256_KEY_BYTES:
            raise ValueError(
                f"must be at least {HS256_KEY_BYTES} bytes (RFC 7518, 3.2; it is "
                f"{len(value.encode())}): make one with "
                "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
            )
        return value

    @field_validator("tenant")
    @classmethod
    def _tenant_name(cls, value: str) -> str:
        if not is_tenant(value):
            raise ValueError(f"tenant must be {TENANT_RULE}")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))

    def agent_list(self) -> list[AgentSpec]:
        """The configured agents, the default first; the demo agent when none is set."""
        return self.agents or [demo_agent()]

    def http_listen_port(self) -> int:
        """The port of the HTTP listener (0: any free port)."""
        if self.http_port is not None:
            return self.http_port
        return self.port + 1 if 0 < self.port < 65535 else 0

    def archive_location(self) -> str | None:
        """The archive store's location; None: archiving is off. The embedded store gets a
        private temporary folder (made once), as undurable as the store itself."""
        if self.archive_store is None and self.redis_url is None:
            self.archive_store = tempfile.mkdtemp(prefix="acp-broker-archive-")
        return self.archive_store

    def hidden_paths(self) -> list[str]:
        """What a sealed agent must never see: the configuration file, the files that hold
        secrets or keys, the archive folder, the store's Unix socket."""
        paths = [
            self._config_path,
            self.redis_url_file,
            self.jwt_secret_file,
            self.cursor_secret_file,
            self.jwt_public_key_file,
            self.jwt_jwks_file,
            self.tls_cert,
            self.tls_key,
        ]
        archive = self.archive_store
        if archive is not None and "://" not in archive:
            paths.append(archive.removeprefix("dir:"))
        if self.redis_url is not None and self.redis_url.startswith("unix://"):
            paths.append(self.redis_url.removeprefix("unix://").partition("?")[0])
        paths += self.sandbox_hidden_paths
        return [os.path.abspath(path) for path in paths if path]

    def cursor_keys(self) -> list[bytes]:
        """Signing keys, newest first; generates one (and warns) when none is set."""
        if self.cursor_secret is None:
            log.warning(
                "no cursor secret configured: generated a random one. List cursors will not "
                "survive a restart or work across nodes; set ACP_BROKER_CURSOR_SECRET."
            )
            self.cursor_secret = secrets.token_urlsafe(32)
        return [s.encode() for s in [self.cursor_secret, *self.cursor_old_secrets]]


def load_settings(config_file: str | None = None, **overrides: Any) -> Settings:
    """Build the settings; ``overrides`` are flags that were given (None = not given)."""
    path = config_file or os.environ.get("ACP_BROKER_CONFIG")
    settings_cls: type[Settings] = Settings
    if path:
        if not Path(path).is_file():
            raise FileNotFoundError(f"config file not found: {path}")
        config = SettingsConfigDict(**{**Settings.model_config, "toml_file": path})
        settings_cls = type("FileSettings", (Settings,), {"model_config": config})
    settings = settings_cls(**{k: v for k, v in overrides.items() if v is not None})
    settings._config_path = path or None
    return settings


SECRET_FILE_SETTINGS = ("redis_url", "jwt_secret", "cursor_secret")
"""Settings that may be given as a file (``redis_url_file``, ``ACP_BROKER_REDIS_URL_FILE``,
``--redis-url-file``), so that the secret is on no command line and in no environment."""


def read_secret_file(path: str, setting: str) -> str:
    """The secret a ``*_file`` setting names: the file's text, without its final newline."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"{setting}: cannot read {path}: {exc.strerror or exc}") from None
    return text.rstrip("\r\n")

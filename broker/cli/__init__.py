"""The ``acp-broker`` command (the package: :mod:`.archive` its archive commands,
:mod:`.tables` the tables it prints)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from pydantic import ValidationError

from .. import loops
from ..config import AgentSpec, Settings, load_settings, read_secret_file
from ..errors.failures import describe
from ..logs import configure as configure_logging
from ..logs import install_redaction
from ..store.client import masked_url
from ..store.errors import StoreError
from . import archive as archive_cli
from .secrets import warn_about_secret_flags

log = logging.getLogger("acp-broker")


def _common(parser: argparse.ArgumentParser, *, embedded: bool = False) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file")
    parser.add_argument(
        "--redis-url",
        help="redis://… (default: the embedded store, inside this process)"
        if embedded
        else "redis://… of the broker's Redis (required, or ACP_BROKER_REDIS_URL: the embedded "
        "store lives inside `serve` and no other process can reach it)",
    )
    parser.add_argument(
        "--redis-url-file",
        metavar="FILE",
        help="a file holding the redis://… URL (keeps its password off the command line, "
        "where any local user reads it; or ACP_BROKER_REDIS_URL_FILE)",
    )
    parser.add_argument("--tenant", help="tenant to act as (default: 'default')")
    parser.add_argument(
        "--allow-evicting-store",
        action="store_true",
        default=None,
        help="run on a Redis whose maxmemory-policy is not noeviction (it may drop sessions)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=os.environ.get("ACP_BROKER_LOG_FORMAT", "text"),
        help="text lines, or one JSON object a line for log collectors "
        "(default: text, or $ACP_BROKER_LOG_FORMAT)",
    )


def _cursor_secret(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cursor-secret",
        help="secret that signs list cursors (readable by any local user on a command line: "
        "prefer --cursor-secret-file)",
    )
    parser.add_argument(
        "--cursor-secret-file", metavar="FILE", help="a file holding the cursor secret"
    )


def _version() -> str:
    try:
        return metadata.version("acp-broker")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="acp-broker",
        description="A broker for the Agent Client Protocol: many clients, many agents, "
        "sessions kept as event logs in Redis.",
    )
    parser.add_argument("--version", action="version", version=f"acp-broker {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(sub)
    _add_worker(sub)
    _add_connect(sub)
    _add_sessions(sub)
    _add_mcp(sub)
    sub.add_parser(
        "demo-agent", help="run the demo ACP agent on stdio (an agent command for --agent)"
    )
    _add_rebuild(sub)
    _add_token(sub)
    doctor = sub.add_parser(
        "doctor",
        help="say how this host runs its agents (sealed or not) and exit 1 if one "
        "that must run sealed cannot",
    )
    doctor.add_argument("--config", metavar="FILE", help="TOML configuration file")
    doctor.add_argument(
        "--agent",
        action="append",
        default=[],
        metavar="NAME='COMMAND ARGS…'",
        help="an agent to check (repeatable; default: the configured ones)",
    )
    return parser


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``serve`` command: a whole broker node."""
    serve = sub.add_parser("serve", help="run a broker node (front, agent host and projector)")
    _common(serve, embedded=True)
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default 8765; 0 = any free port)")
    serve.add_argument(
        "--http-port",
        type=int,
        help="MCP (/mcp) and REST (/v1/…) port (default: --port + 1; 0 = any free port)",
    )
    serve.add_argument(
        "--agent",
        action="append",
        default=[],
        metavar="NAME='COMMAND ARGS…'",
        help="an ACP agent to run over stdio (repeatable; the first is the default)",
    )
    _cursor_secret(serve)
    serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="turn authentication off even beyond loopback (anyone reaching the port gets in)",
    )
    serve.add_argument("--tls-cert", help="PEM certificate: serve wss:// and https:// directly")
    serve.add_argument("--tls-key", help="PEM private key for --tls-cert")
    serve.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin allowed to connect (repeatable)",
    )
    serve.add_argument(
        "--no-workers",
        action="store_true",
        help="front node only: no agent host, no projector (run them as workers)",
    )


def _add_worker(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``worker`` command: one worker role."""
    worker = sub.add_parser("worker", help="run one worker role")
    roles = worker.add_subparsers(dest="role", required=True, metavar="ROLE")
    projector = roles.add_parser("projector", help="keep the session index up to date")
    _common(projector)
    host = roles.add_parser("agent-host", help="run agents for the sessions front nodes route here")
    _common(host)
    host.add_argument(
        "--agent",
        action="append",
        default=[],
        metavar="NAME='COMMAND ARGS…'",
        help="an ACP agent to run over stdio (repeatable; the first is the default)",
    )


def _add_connect(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``connect`` command: the stdio bridge."""
    connect = sub.add_parser(
        "connect", help="bridge stdio to a broker's WebSocket (use the broker as an editor's agent)"
    )
    connect.add_argument(
        "url", nargs="+", help="ws://HOST:PORT/acp (several: tried in turn after a drop)"
    )
    connect.add_argument(
        "--give-up-after",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="after a drop, how long the broker may stay out of reach before the bridge "
        "exits 1 (default 60)",
    )
    connect.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'")
    connect.add_argument(
        "--token",
        help="sent as 'Authorization: Bearer TOKEN' (readable by any local user on a command "
        "line: prefer --token-file or ACP_BROKER_TOKEN)",
    )
    connect.add_argument("--token-file", metavar="FILE", help="a file holding the token")


def _add_sessions(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``sessions`` command: a page of the session list."""
    sessions = sub.add_parser(
        "sessions", help="print a page of the session list (newest created first)"
    )
    _common(sessions)
    sessions.add_argument("--status", help="RUNNING, STOPPED, DELETED, ERROR (comma-separated)")
    sessions.add_argument("--kind", help="browser, shell or combined")
    sessions.add_argument("-q", "--q", help="a session id prefix, or words of the user metadata")
    sessions.add_argument("--limit", type=int, help="how many, 1 to 100 (default 20)")
    sessions.add_argument("--after", metavar="CURSOR", help="continue after an earlier page")
    sessions.add_argument("--cwd", help="only sessions in this working directory")
    _cursor_secret(sessions)


def _add_mcp(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``mcp`` command: the MCP session tools over stdio."""
    mcp = sub.add_parser(
        "mcp",
        help="serve the MCP session tools over stdio, on the broker's Redis (session_list "
        "reads the index; the others run agents on the deployment's agent hosts)",
    )
    _common(mcp)
    _cursor_secret(mcp)


def _add_rebuild(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``rebuild-index`` command and the archive store's commands."""
    rebuild = sub.add_parser("rebuild-index", help="rebuild the session index from the logs")
    _common(rebuild)
    rebuild.add_argument(
        "--archive-store", help="where archived logs are (dir:PATH, postgresql://…)"
    )
    for operator in archive_cli.add_commands(sub):
        _common(operator)


def _add_token(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``token`` command: API tokens."""
    token = sub.add_parser("token", help="create, list and revoke API tokens")
    actions = token.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a token (printed once)")
    _common(create)
    create.add_argument(
        "--scope",
        action="append",
        choices=["read", "write", "admin"],
        default=[],
        help="repeatable (default: read and write)",
    )
    create.add_argument("--name", default="", help="a label to recognize it by")
    create.add_argument(
        "--roles",
        default=None,
        help="comma-separated session roles it holds on every session of its tenant "
        "(observer, controller, approver, owner; default: those of its scopes)",
    )
    listing = actions.add_parser("list", help="list tokens (never their secrets)")
    _common(listing)
    revoke = actions.add_parser("revoke", help="revoke a token by id")
    _common(revoke)
    revoke.add_argument("id", help="the token id (the part after acpb_)")


def _settings(args: argparse.Namespace, **extra: Any) -> Settings:
    warn_about_secret_flags(args)
    for name in ("redis_url", "cursor_secret"):  # a flag's file beats the environment's value
        path = getattr(args, f"{name}_file", None)
        if path and not getattr(args, name, None):
            extra[name] = read_secret_file(path, f"--{name.replace('_', '-')}-file")
            extra[f"{name}_file"] = path
    return load_settings(
        getattr(args, "config", None),
        redis_url=extra.pop("redis_url", None) or getattr(args, "redis_url", None),
        tenant=getattr(args, "tenant", None),
        allow_evicting_store=getattr(args, "allow_evicting_store", None),
        **extra,
    )


def _cmd_serve(args: argparse.Namespace) -> int:
    from ..serve import run_broker

    agents = [AgentSpec.parse(text) for text in args.agent] or None
    settings = _settings(
        args,
        host=args.host,
        port=args.port,
        http_port=args.http_port,
        agents=agents,
        cursor_secret=args.cursor_secret,
        workers=False if args.no_workers else None,
        auth="off" if args.insecure_no_auth else None,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        allowed_origins=args.allowed_origin or None,
    )
    loops.run(run_broker(settings), settings.event_loop)
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    from workers.roles import run_agent_host, run_projector_role

    agents = [AgentSpec.parse(text) for text in getattr(args, "agent", [])] or None
    settings = _settings(args, agents=agents)
    if settings.redis_url is None:
        raise SystemExit(
            "acp-broker worker: --redis-url is required (workers share Redis with nodes)"
        )
    role = run_agent_host if args.role == "agent-host" else run_projector_role
    loops.run(role(settings), settings.event_loop)
    return 0


def _cmd_connect(args: argparse.Namespace) -> int:
    from ..clients.bridge import main_connect

    warn_about_secret_flags(args)
    token = args.token or os.environ.get("ACP_BROKER_TOKEN")
    if args.token_file:
        token = read_secret_file(args.token_file, "--token-file")
    return main_connect(args.url, args.header, token, args.give_up_after)


def _cmd_sessions(args: argparse.Namespace) -> int:
    from .tables import print_sessions

    settings = _settings(args, cursor_secret=args.cursor_secret)
    inputs = {"status": args.status, "kind": args.kind, "q": args.q, "after": args.after}
    inputs["limit"] = args.limit
    return asyncio.run(print_sessions(settings, inputs, cwd=args.cwd))


def _cmd_demo_agent(args: argparse.Namespace) -> int:
    from ..demo.agent import main as run_demo_agent

    logging.getLogger().setLevel(logging.WARNING)  # stdout is the ACP stream; stderr stays quiet
    run_demo_agent()
    return 0


def _cmd_mcp(args: argparse.Namespace) -> int:
    from ..front.http.mcp import serve_stdio

    settings = _settings(args, cursor_secret=args.cursor_secret)
    if settings.redis_url is None:
        raise SystemExit("acp-broker mcp: --redis-url is required (it reads a broker's Redis)")
    asyncio.run(serve_stdio(settings))
    return 0


def _cmd_rebuild(args: argparse.Namespace) -> int:
    from broker.store.rebuild import rebuild_index

    from ..store.archive import open_archive
    from ..store.client import connect

    settings = _settings(args, archive_store=args.archive_store)
    if settings.redis_url is None:
        raise SystemExit("acp-broker rebuild-index: --redis-url is required")

    async def run() -> dict[str, int]:
        redis = connect(settings.redis_url, timeout=settings.redis_timeout)
        location = settings.archive_location()
        archive = open_archive(location) if location is not None else None
        try:
            return await rebuild_index(redis, archive)
        finally:
            if archive is not None:
                await archive.close()
            await redis.aclose()

    counts = asyncio.run(run())
    for tenant, count in sorted(counts.items()):
        print(f"{tenant}: {count} sessions re-indexed")
    if not counts:
        print("no sessions found")
    return 0


def _cmd_token(args: argparse.Namespace) -> int:
    from ..auth.tokens import TokenStore
    from ..store.client import connect

    settings = _settings(args)
    if settings.redis_url is None:
        raise SystemExit("acp-broker token: --redis-url is required (tokens live in Redis)")

    async def run() -> int:
        redis = connect(settings.redis_url, timeout=settings.redis_timeout)
        try:
            store = TokenStore(redis)
            if args.action == "create":
                roles = None if args.roles is None else [r for r in args.roles.split(",") if r]
                try:
                    token, info = await store.create(
                        settings.tenant, args.scope or ["read", "write"], args.name, roles
                    )
                except ValueError as exc:
                    print(f"acp-broker token create: {exc}", file=sys.stderr)
                    return 2
                print(token)
                held = "" if info.roles is None else f", roles {','.join(info.roles)}"
                print(
                    f"id {info.id}, tenant {info.tenant}, scopes {','.join(info.scopes)}{held}: "
                    "keep the token, it is not shown again",
                    file=sys.stderr,
                )
            elif args.action == "list":
                for info in await store.list(args.tenant):
                    state = "revoked" if info.revoked else "active"
                    held = "" if info.roles is None else f"  roles {','.join(info.roles)}"
                    print(
                        f"{info.id}  {info.tenant}  {','.join(info.scopes)}  {state}  "
                        f"{info.name}{held}"
                    )
            elif not await store.revoke(args.id):
                print(f"acp-broker token revoke: no token {args.id}", file=sys.stderr)
                return 1
            return 0
        finally:
            await redis.aclose()

    return asyncio.run(run())


def _cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import report

    agents = [AgentSpec.parse(text) for text in args.agent] or None
    lines, healthy = asyncio.run(report(_settings(args, agents=agents)))
    print("\n".join(lines))
    return 0 if healthy else 1


def _cmd_archive(args: argparse.Namespace) -> int:
    settings = _settings(args, archive_store=args.archive_store)
    return asyncio.run(archive_cli.run(settings, args.command, args.older_than, args.dry_run))


_COMMANDS = {
    "archive": _cmd_archive,
    "purge": _cmd_archive,
    "serve": _cmd_serve,
    "worker": _cmd_worker,
    "connect": _cmd_connect,
    "sessions": _cmd_sessions,
    "mcp": _cmd_mcp,
    "demo-agent": _cmd_demo_agent,
    "rebuild-index": _cmd_rebuild,
    "token": _cmd_token,
    "doctor": _cmd_doctor,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(
        verbose=getattr(args, "verbose", False),
        log_format=getattr(args, "log_format", "text"),
    )
    install_redaction()
    try:
        return _COMMANDS[args.command](args)
    except (ValidationError, ValueError, FileNotFoundError) as exc:
        print(f"acp-broker {args.command}: {_one_line(exc)}", file=sys.stderr)
        return 2
    except (StoreError, OSError) as exc:
        # One sentence, no traceback: what could not be reached, and why.
        url = masked_url(getattr(args, "redis_url", None) or os.environ.get("ACP_BROKER_REDIS_URL"))
        print(
            f"acp-broker {args.command}: cannot use the store at {url}: {describe(exc)}",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        return 130


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        # pydantic's own text quotes each bad input: a secret's value would be printed.
        text = "; ".join(
            _setting_error(error) for error in exc.errors(include_url=False, include_input=False)
        )
    else:
        text = str(exc)
    return " ".join(text.split())


def _setting_error(error: Any) -> str:
    """``name: what is wrong`` for one of a ValidationError's errors (no input quoted)."""
    name = ".".join(map(str, error["loc"])) or "settings"
    return f"{name}: {str(error['msg']).removeprefix('Value error, ')}"

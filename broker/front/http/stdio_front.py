"""What ``acp-broker mcp`` over stdio needs to run agents: a small front of its own.

The session tools reach agent hosts as a front node does, through Redis: this process
gets its own node channel for replies (:class:`~broker.front.fanout.FanoutHub`), the
path to the hosts (:class:`~broker.front.agents.RemoteAgents`) and the router that
answers the hosts' questions for it (with "no window here": an agent's question goes
to the windows where the session is open). It serves no ACP connection of its own.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from ...config import Settings
from ...store.client import Store
from ...store.index import SessionIndex
from ...store.log import SessionLog
from ..agents import RemoteAgents
from ..fanout import FanoutHub
from ..routing import NodeRouter
from .session_tools import SessionTools, tool_access

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def stdio_tools(settings: Settings, store: Store) -> AsyncIterator[SessionTools]:
    """The session tools of a stdio MCP server, on ``store``, for the settings' tenant.

    A store that cannot be reached at start does not stop the server: ``session_list``
    answers once it can, the other tools ``unavailable`` (restart the server then)."""
    session_log = SessionLog(
        store, feed_maxlen=settings.feed_maxlen, max_events=settings.max_events_per_session
    )
    index = SessionIndex(store)
    hub = FanoutHub(store, session_log)
    agents = RemoteAgents(
        store,
        settings.agent_list(),
        reply_channel=hub.node_channel,
        ack_timeout=settings.ack_timeout,
    )
    hub.listener = NodeRouter(store, hub, agents, answer_timeout=settings.answer_timeout)
    tools = SessionTools(settings, session_log, index, hub, agents, tool_access(settings, None))
    try:
        await hub.start()
    except Exception as exc:  # told once here; each tool call says it in its own words
        log.warning("acp-broker mcp: the store cannot be reached now: %s", exc)
        tools.unreachable = f"the broker's store could not be reached at start ({exc})"
    try:
        yield tools
    finally:
        await tools.close()
        await hub.stop()
        index.close()
        session_log.close()

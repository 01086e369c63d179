"""The editor's own prompts, replayed to the stdio bridge after a drop: pure.

The broker shows a v1 prompt to every window of the session but the connection that sent
it. After a drop, the new connection is not that one: a replay (or a prompt that reached
the log only after the drop) would show the editor its own prompt. :class:`OwnPrompts`
recognizes it (a ``user_message_chunk`` whose content is the first block of one of the
editor's latest prompts to the session, and every chunk of the same event) while the
session recovers, and only then.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["OwnPrompts"]

KEPT: Final = 4
"""The editor's latest prompts kept per session."""


class OwnPrompts:
    """The editor's latest prompts per session, and the sessions that recover."""

    def __init__(self) -> None:
        self._first_blocks: dict[str, list[Any]] = {}
        self._seqs: set[tuple[str, int]] = set()
        self.recovering: set[str] = set()
        """Sessions resumed after a drop whose replay may hold the editor's prompts."""

    def sent(self, session_id: str, prompt: Any) -> None:
        """The editor sent ``prompt`` (its content blocks) to the session."""
        if isinstance(prompt, list) and prompt:
            blocks = self._first_blocks.setdefault(session_id, [])
            blocks.append(prompt[0])
            del blocks[:-KEPT]

    def forget(self, session_id: str) -> None:
        """The session is no longer followed."""
        self._first_blocks.pop(session_id, None)
        self.recovering.discard(session_id)

    def is_echo(self, session_id: str, seq: int, update: Any) -> bool:
        """Whether the update at ``seq`` is the editor's own prompt, shown back."""
        if (session_id, seq) in self._seqs:
            return True
        if session_id not in self.recovering or not isinstance(update, dict):
            return False
        if update.get("sessionUpdate") != "user_message_chunk":
            return False
        blocks = self._first_blocks.get(session_id) or []
        content = update.get("content")
        for index, block in enumerate(blocks):
            if block == content:
                del blocks[index]
                self._seqs.add((session_id, seq))
                return True
        return False

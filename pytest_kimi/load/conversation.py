"""Multi-turn conversations: each closed-loop stream continues its own chat for ``turns`` turns.

Turn 1 is the stream's ordinary request.  Turn ``k + 1`` sends everything of turn ``k`` again,
plus the assistant's answer exactly as the server streamed it, plus a follow-up user message
(:data:`FOLLOW_UPS`, in order, so runs repeat): the prompt grows by an answer and a question
per turn, as a chat user's does, and a server's prefix cache finds the conversation so far.
After the last turn the stream opens a new conversation with its next prompt.  With the
``completions`` API the conversation is one plain-text transcript that grows the same way.

Why this is cheap enough for the load client (which must never be the bottleneck):

* Nothing runs per chunk.  A request whose answer is needed (every turn but the last) keeps a
  reference to each raw read block (:attr:`~pytest_kimi.load.records.RequestRecord.blocks`,
  one list append per read, no copy) and the answer is taken once, when the stream has ended:
  one regular-expression pass over the joined blocks collects the ``content`` (``text``)
  strings of the events.
* Nothing is decoded.  The answer stays in its JSON-escaped form: escaped strings laid end to
  end are one valid escaped string (an escape never spans two events), so the server's bytes go
  straight into the next body.  The history is kept as encoded bytes too, and the next body is
  one join: the body's bytes before the messages, the history, the bytes after.  A prompt
  body is decoded once per conversation template (per distinct body of the trial), not per
  request.

Only the answer (``delta.content``) goes back, never the reasoning (``reasoning_content``):
reasoning models are served the previous turns without their thinking, as chat front ends
send them.  The pattern ``"content":"`` cannot match inside ``"reasoning_content":"`` (the
character before ``content`` is ``_``, not a quote), nor inside token text, where every quote
is escaped (the argument of :mod:`.sse`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from pytest_kimi.load.records import Api, RequestRecord

FOLLOW_UPS: tuple[str, ...] = (
    "Thanks. Can you go into more detail on that?",
    "Give a concrete example.",
    "What are the trade-offs or pitfalls here?",
    "Summarize everything so far in a few sentences.",
    "How would you explain it to a beginner?",
    "What would you do differently, and why?",
    "List the key points as bullet points.",
    "Is there anything important you left out?",
)
"""The user's turns after the first, in order (turn ``k + 1`` asks ``FOLLOW_UPS[k - 1]``,
cycling): deterministic, so two runs send the same conversations."""

TRANSCRIPT_USER = "\n\nUser: "
TRANSCRIPT_ASSISTANT = "\nAssistant: "
"""How the ``completions`` API's transcript marks a follow-up: the previous prompt and its
answer, then ``User: <follow-up>`` and ``Assistant: `` to answer after."""

_HOLE = "\x00kimi-conversation\x00"
"""Stands in for the messages (prompt) while a body is split around them; it cannot occur in
a JSON-encoded body (a NUL is always escaped there)."""

_ANSWER = {
    # the event's answer text, still escaped: "content":"...", any JSON spacing
    "chat": re.compile(rb'"content":\s*"([^"\\]*(?:\\.[^"\\]*)*)"'),
    "completions": re.compile(rb'"text":\s*"([^"\\]*(?:\\.[^"\\]*)*)"'),
}


class ConversationError(ValueError):
    """A request body that cannot carry a conversation (no messages / prompt to extend)."""


def answer_bytes(blocks: list[bytes], api: Api) -> bytes:
    """The answer a stream carried, JSON-escaped, from its raw read blocks.

    The concatenated ``content`` (chat) or ``text`` (completions) strings of every event, in
    order; reasoning deltas are left out.  Run once per request, after its stream ended.
    """
    return b"".join(_ANSWER[api].findall(b"".join(blocks)))


def escaped(text: str) -> bytes:
    """``text`` as the inside of a JSON string (what :func:`answer_bytes` returns)."""
    return json.dumps(text)[1:-1].encode()


@dataclass(frozen=True, slots=True)
class Template:
    """A prompt body split around its conversation: ``head + history + tail`` is a body.

    ``history`` is the inside of the ``messages`` list (chat) or of the ``prompt`` string
    (completions), encoded; ``opening`` is turn 1's history, split at the unique-id slot when
    the body has one (``opening[0] + id + opening[1]``).
    """

    head: bytes
    tail: bytes
    opening: tuple[bytes, ...]


def split_body(body: bytes, api: Api, slot: bytes | None) -> Template:
    """Decode one prompt body (once per distinct body) into its :class:`Template`."""
    try:
        obj = json.loads(body)
    except ValueError as exc:
        raise ConversationError(f"the request body is not JSON: {exc}") from None
    key = "messages" if api == "chat" else "prompt"
    value = obj.get(key) if isinstance(obj, dict) else None
    if api == "chat" and not (isinstance(value, list) and value):
        raise ConversationError("a chat body needs a non-empty 'messages' list to continue")
    if api == "completions" and not isinstance(value, str):
        raise ConversationError("a completions body needs a 'prompt' string to continue")
    obj[key] = _HOLE
    head, hole, tail = (
        json.dumps(obj, separators=(",", ":")).encode().partition(json.dumps(_HOLE).encode())
    )
    assert hole, "the placeholder is encoded as it was written"
    if isinstance(value, str):
        inner = escaped(value)
        head, tail = head + b'"', b'"' + tail
    else:
        inner = json.dumps(value, separators=(",", ":")).encode()[1:-1]
        head, tail = head + b"[", b"]" + tail
    opening: tuple[bytes, ...] = (inner,)
    if slot is not None and inner.count(slot) == 1:
        before, _, after = inner.partition(slot)
        opening = (before, after)
    return Template(head, tail, opening)


@dataclass(slots=True)
class Conversations:
    """The conversations of one trial: templates per prompt body, follow-ups pre-encoded."""

    turns: int
    api: Api
    slot: bytes | None = None
    """The unique-id slot of the bodies (:attr:`~pytest_kimi.load.trial.TrialPlan.unique_slot`)."""
    _templates: dict[int, Template] = field(default_factory=dict)
    _follow_ups: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        if self.turns < 2:
            raise ValueError("a conversation has turns >= 2")
        if self.api == "chat":
            self._follow_ups = tuple(
                b"," + json.dumps({"role": "user", "content": f}, separators=(",", ":")).encode()
                for f in FOLLOW_UPS
            )
        else:
            self._follow_ups = tuple(
                escaped(TRANSCRIPT_USER + f + TRANSCRIPT_ASSISTANT) for f in FOLLOW_UPS
            )

    def open(self, key: int, body: bytes, unique: bytes | None) -> Conversation:
        """A new conversation whose turn 1 is ``body`` (the prompt body number ``key``, with
        the slot still in it) sent with the id ``unique`` in its slot."""
        template = self._templates.get(key)
        if template is None:
            template = self._templates[key] = split_body(body, self.api, self.slot)
        opening = template.opening
        history = opening[0] if len(opening) == 1 or unique is None else unique.join(opening)
        return Conversation(self, template, history)

    def follow_up(self, turn: int) -> bytes:
        """The encoded user message that opens turn ``turn`` (2, 3, ...)."""
        return self._follow_ups[(turn - 2) % len(self._follow_ups)]

    def assistant(self, answer: bytes) -> bytes:
        """The encoded assistant turn that carries ``answer`` (escaped)."""
        if self.api == "chat":
            return b',{"role":"assistant","content":"' + answer + b'"}'
        return answer


@dataclass(slots=True)
class Conversation:
    """One stream's conversation: the history so far and the turn last sent."""

    book: Conversations
    template: Template
    history: bytes
    turn: int = 1

    def wants_answer(self) -> bool:
        """Whether the turn just sent has a next one (its answer must then be kept)."""
        return self.turn < self.book.turns

    def reply(self, rec: RequestRecord) -> bool:
        """Take the answer of the turn just sent (from ``rec``'s kept blocks, which are
        released); False when the conversation is over: its last turn, or a failed one."""
        blocks, rec.blocks = rec.blocks, None
        if not rec.ok or rec.cut or not self.wants_answer() or blocks is None:
            return False
        book = self.book
        self.turn += 1
        self.history = b"".join(
            (
                self.history,
                book.assistant(answer_bytes(blocks, book.api)),
                book.follow_up(self.turn),
            )
        )
        return True

    def body(self) -> bytes:
        """The request body of the current turn."""
        return b"".join((self.template.head, self.history, self.template.tail))


def messages_of(body: bytes) -> list[dict[str, Any]]:
    """The messages of a chat body (for tests and debugging)."""
    return list(json.loads(body)["messages"])

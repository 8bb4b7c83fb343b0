"""Token spans of a rendered prompt: sessions, turns and evidence, in history-token coordinates.

A span is half-open ``[start, end)`` over history token positions ``0..L-1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from relaylens.datasets.records import Session
from relaylens.errors import RecordError, RelaylensError

if TYPE_CHECKING:  # token tensors are built when a prompt is rendered; importing spans imports no torch
    import torch


@dataclass(frozen=True)
class Span:
    """One unit of the history.

    Attributes:
        kind: ``"session"`` or ``"turn"``.
        index: ordinal of the unit among units of its kind (0-based, prompt order).
        session_id: the record's id of the session this unit belongs to.
        start, end: half-open history-token range.
        is_evidence: gold evidence at this unit's granularity (session in ``answer_session_ids`` / turn with
            ``has_answer``). Never rendered into the prompt text.
        role: ``"user"`` / ``"assistant"`` for turns, ``None`` for sessions.
        text: the unit's source text (the whole session's turns joined, or the turn content) for retrieval.
    """

    kind: str
    index: int
    session_id: str
    start: int
    end: int
    is_evidence: bool
    role: str | None = None
    text: str = ""

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class RenderedPrompt:
    """A record rendered for one model: history tokens, question tokens and unit spans.

    Attributes:
        record_id: the record's id.
        history_ids: ``[L]`` long; the history part of the prompt (everything before the question block).
        question_ids: ``[Q]`` long; the question block (current date, question, answer cue, generation prompt).
        history_text, question_text: the exact decoded texts (``history_text + question_text`` is the prompt).
        question: the bare question string (what BM25 reads).
        sessions: session spans in prompt order.
        turns: turn spans in prompt order.
        mode: ``"chat"`` or ``"completion"``.
        text_start: the first history token of the prompt text itself; the tokens before it are the chat
            template's head (system turn, user header) or a BOS token.
    """

    record_id: str
    history_ids: torch.Tensor  # [L]
    question_ids: torch.Tensor  # [Q]
    history_text: str
    question_text: str
    question: str
    sessions: tuple[Span, ...]
    turns: tuple[Span, ...]
    mode: str = "chat"
    text_start: int = 0

    @property
    def history_length(self) -> int:
        return int(self.history_ids.numel())

    def units(self, granularity: str) -> tuple[Span, ...]:
        """Spans at ``"session"`` or ``"turn"`` granularity."""
        if granularity == "session":
            return self.sessions
        if granularity == "turn":
            return self.turns
        raise RelaylensError(f"unit granularity must be 'session' or 'turn'; got {granularity!r}. Fix: pass one of "
                             "those")

    def protected_mask(self) -> torch.Tensor:
        """``[L]`` bool: history tokens outside every session span (task instruction, chat-template head, separators
        between units): what ``--protect-instructions`` keeps outside the budget
        (:mod:`relaylens.selectors.protection`)."""
        import torch  # noqa: PLC0415 - torch-free room

        mask = torch.ones(self.history_length, dtype=torch.bool)
        for span in self.sessions:
            mask[span.start : span.end] = False
        return mask

    def framing_parts(self) -> dict[str, torch.Tensor]:
        """``[L]`` bool masks of the history's framing, by part (what the ``framing`` analysis keeps cell by cell):

        * ``template``: the chat template's head before the prompt text (system turn, user header; BOS in completion
          mode; nothing when neither exists);
        * ``instruction``: the prompt text before the first session (task instruction and ``History Chats:``);
        * ``separators``: the other tokens outside every session (newlines between and after sessions);
        * ``headers``: tokens inside a session but outside its turns (``### Session i:``, ``Session Date: ...``,
          ``Session Content:``).

        ``template | instruction | separators`` is :meth:`protected_mask`; a record whose prompt cannot be split this
        way (no session, or a session that starts inside the template) raises :class:`~relaylens.errors.RecordError`.
        """
        import torch  # noqa: PLC0415 - torch-free room


        length = self.history_length
        if not self.sessions:
            raise RecordError(f"record {self.record_id!r}: the prompt has no session span, so its framing cannot be "
                              "told from its history. Fix: give the record at least one session with a turn")
        first = min(span.start for span in self.sessions)
        if not 0 <= self.text_start <= first:
            raise RecordError(f"record {self.record_id!r}: its first session starts at token {first}, inside the chat "
                              f"template's head (which ends at token {self.text_start}); the template interleaves with "
                              "the history. Fix: a chat template that keeps the user message whole, or --prompt-mode "
                              "completion")
        outside = self.protected_mask()
        parts = {name: torch.zeros(length, dtype=torch.bool) for name in ("template", "instruction", "headers")}
        parts["template"][: self.text_start] = True
        parts["instruction"][self.text_start : first] = True
        parts["separators"] = outside & ~parts["template"] & ~parts["instruction"]
        in_turn = torch.zeros(length, dtype=torch.bool)
        for span in self.turns:
            in_turn[span.start : span.end] = True
        parts["headers"] = ~outside & ~in_turn
        return parts

    def evidence_mask(self, granularity: str = "turn") -> torch.Tensor:
        """``[L]`` bool: history tokens inside gold evidence units at the given granularity."""
        import torch  # noqa: PLC0415 - torch-free room

        mask = torch.zeros(self.history_length, dtype=torch.bool)
        for span in self.units(granularity):
            if span.is_evidence:
                mask[span.start : span.end] = True
        return mask


@dataclass(frozen=True)
class PromptLayout:
    """The rendered text (before any chat template) with character ranges of every unit.

    ``sessions`` and ``turns`` are ``(Session / Turn index path, start, end)`` character ranges into ``text``;
    ``question_start`` is where the question block begins.
    """

    text: str
    question_start: int
    sessions: tuple[tuple[Session, int, int], ...]
    turns: tuple[tuple[Session, int, int, int], ...]  # (session, turn index in session, start, end)

    @property
    def history_text(self) -> str:
        return self.text[: self.question_start]

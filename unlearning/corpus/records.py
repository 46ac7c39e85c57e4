"""Training records: their shapes, their parsing from JSON objects, and their digests.

A record has one of three shapes: free text (`text`), a question/answer pair
(`question` + `answer`, or the synonyms `prompt` + `response` and OpenAI's `prompt` +
`completion`), or a chat
(`messages`: a list of `{"role", "content"}` turns; the assistant turns are
what a model learns; a `content` may also be OpenAI's list of text parts, `chat_content`).
Shapes users commonly bring are read as these: Alpaca (`instruction`, optional `input`,
`output`) and Databricks Dolly (`instruction`, optional `context`, `response`; its
`category` is a label, ignored like any unknown field) as a question/answer pair, and
ShareGPT (`conversations`: `{"from", "value"}` turns, `SHAREGPT_ROLES`) as a chat; their
records are those of the native shapes (same digests), so nothing downstream knows them.
Optional: an `id`, a grouping field (`doc`, `source` or
`thread`: records of one document or conversation), the TOFU extras
`paraphrased_question`, `paraphrased_answer`, `perturbed_answer` (a string or
a list of strings), and a `meta` object.  An object that fits no shape raises
`RecordMisfit` (a `CorpusError` naming the file, the line, row or array item, and the
field); readers of whole corpora count and name such objects in a load report instead.

Digests: `record_digest` hashes a record's canonical JSON; `merkle_root`
pins a set of records; a corpus's `manifest_digest` is the Merkle root of
all its records, so it depends on content, not on file layout (`merkle_root_of_leaves`
computes the same root from raw 32-byte digests, for corpora too large for hex strings).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OPTIONAL_TEXT_FIELDS = ("paraphrased_question", "paraphrased_answer")
GROUP_FIELDS = ("doc", "source", "thread")
ALPACA_FIELDS = ("instruction", "input", "output")
DOLLY_FIELDS = ("instruction", "context", "response")  # Dolly's `category` is a label: not read
KNOWN_FIELDS = frozenset(
    {"id", "text", "question", "answer", "prompt", "response", "completion", "meta", "perturbed_answer",
     "messages", "conversations"}
    | set(OPTIONAL_TEXT_FIELDS) | set(GROUP_FIELDS) | set(ALPACA_FIELDS) | set(DOLLY_FIELDS)
)
SHAPES = ("qa", "text", "chat")
# ShareGPT speakers (`from`, compared lower-cased) and the chat role each one is.  Any other
# speaker makes the record a misfit: guessing whether a turn is learnt would train on (or
# hide) the wrong text.
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bing": "assistant", "system": "system"}


class CorpusError(ValueError):
    """A corpus file that cannot be read; the message names file, line and field."""

    def __init__(self, path: str | Path, where: str, field_name: str | None, reason: str) -> None:
        self.path = str(path)
        self.where = where
        self.field = field_name
        self.reason = reason
        location = f"{self.path}:{where}"
        if field_name:
            location += f": field '{field_name}'"
        super().__init__(f"{location}: {reason}")


class RecordMisfit(CorpusError):
    """A JSON value that is no record of any shape (not a file error: readers report it)."""


@dataclass(frozen=True)
class Message:
    """One turn of a chat record.  `role` is kept as given (user, assistant, system ...)."""

    role: str
    content: str

    @property
    def learnt(self) -> bool:
        """Assistant turns are what a model is trained to say; the rest is context."""
        return self.role == "assistant"


@dataclass(frozen=True)
class Record:
    """One training record: `text`, or `question` and `answer`, or chat `messages`."""

    id: str
    question: str | None = None
    answer: str | None = None
    text: str | None = None
    paraphrased_question: str | None = None
    paraphrased_answer: str | None = None
    perturbed_answer: tuple[str, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False)
    messages: tuple[Message, ...] = ()
    group: str | None = None  # the document, source or thread the record belongs to
    group_field: str | None = None  # which of GROUP_FIELDS held it (kept for the digest)

    @property
    def is_qa(self) -> bool:
        return self.question is not None and self.answer is not None

    @property
    def is_chat(self) -> bool:
        return bool(self.messages)

    @property
    def shape(self) -> str:
        """`qa`, `chat` or `text`."""
        # `is_qa` and `is_chat` written out: set building asks thousands of records.
        return "qa" if self.question is not None and self.answer is not None else \
            "chat" if self.messages else "text"

    def searchable_text(self) -> str:
        """Everything a subject's name could appear in, for set building."""
        if self.question is None and self.answer is None and not self.perturbed_answer \
                and not self.messages and self.paraphrased_question is None and self.paraphrased_answer is None:
            return self.text or ""  # free text, the commonest record: the join below, without the lists
        parts = [self.question, self.answer, self.text, *self.perturbed_answer]
        parts += [self.paraphrased_question, self.paraphrased_answer]
        parts += [m.content for m in self.messages]
        return "\n".join(part for part in parts if part)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.id}
        for name in ("question", "answer", "text", *OPTIONAL_TEXT_FIELDS):
            value = getattr(self, name)
            if value is not None:
                data[name] = value
        if self.perturbed_answer:
            data["perturbed_answer"] = list(self.perturbed_answer)
        if self.messages:
            data["messages"] = [{"role": m.role, "content": m.content} for m in self.messages]
        if self.group is not None:
            data[self.group_field or "doc"] = self.group
        if self.meta:
            data["meta"] = dict(self.meta)
        return data


def record_digest(record: Record) -> str:
    """sha256 hex of the record's canonical JSON (sorted keys, no whitespace, UTF-8)."""
    return record_digest_bytes(record).hex()


def record_digest_bytes(record: Record) -> bytes:
    """The raw 32 bytes of `record_digest`."""
    canonical = json.dumps(record.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).digest()


def merkle_root(digests: Iterable[str]) -> str:
    """Merkle root (sha256 hex) of a set of hex digests.

    Leaves are sorted, so the root pins the set whatever order it was built
    in.  Leaf and node hashes carry different prefixes (0x00, 0x01) so a
    node can never pass for a leaf; an odd node is carried up unchanged.
    The empty set's root is sha256 of the empty string.
    """
    level = [hashlib.sha256(b"\x00" + bytes.fromhex(d)).digest() for d in sorted(digests)]
    if not level:
        return hashlib.sha256(b"").hexdigest()
    while len(level) > 1:
        nxt = [
            hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest()
            for i in range(0, len(level) - 1, 2)
        ]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0].hex()


def merkle_root_of_leaves(leaves: Sequence[bytes]) -> str:
    """`merkle_root` of raw 32-byte record digests already sorted (bytewise = hex order)."""
    level = [hashlib.sha256(b"\x00" + leaf).digest() for leaf in leaves]
    if not level:
        return hashlib.sha256(b"").hexdigest()
    while len(level) > 1:
        nxt = [hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest()
               for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0].hex()


def _string(path: str | Path, where: str, data: Mapping[str, Any], name: str) -> str | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise RecordMisfit(path, where, name, f"expected a string, got {type(value).__name__}")
    return value


_PLAIN_TEXT_KEYS = frozenset({"id", "text"})


def parse_record(path: str | Path, where: str, data: Any, default_id: str) -> Record:
    """A record from one JSON object; `RecordMisfit` when it fits no shape."""
    if type(data) is dict and data.keys() <= _PLAIN_TEXT_KEYS:
        # The commonest shape, `{"id", "text"}`, without the general path's look-ups (a
        # retain pool parses thousands); the same record (tests/unlearning/test_corpus.py).
        text, raw_id = data.get("text"), data.get("id", default_id)
        if type(text) is str and text.strip() and type(raw_id) in (str, int):
            return _text_record(str(raw_id), text)
    return _parse_record(path, where, data, default_id)


def _text_record(record_id: str, text: str) -> Record:
    """`Record(id=record_id, text=text)`, without the frozen dataclass's `__init__` (a
    `object.__setattr__` per field, most of the cost of parsing a retain pool): the same
    fields in the same order, the same values, a `meta` dict of its own
    (tests/unlearning/test_corpus.py)."""
    record = object.__new__(Record)
    record.__dict__.update(id=record_id, question=None, answer=None, text=text, paraphrased_question=None,
                           paraphrased_answer=None, perturbed_answer=(), meta={}, messages=(), group=None,
                           group_field=None)
    return record


def _parse_record(path: str | Path, where: str, data: Any, default_id: str) -> Record:
    if not isinstance(data, dict):
        raise RecordMisfit(path, where, None, f"expected a JSON object, got {type(data).__name__}")
    question = _string(path, where, data, "question")
    answer = _string(path, where, data, "answer")
    prompt = _string(path, where, data, "prompt")
    response = _string(path, where, data, "response")
    completion = _string(path, where, data, "completion")
    if response is not None and completion is not None:
        raise RecordMisfit(path, where, "completion",
                           "a record holds one answer to its prompt: 'response' or 'completion', not both")
    if question is None and answer is None:
        if prompt is not None or completion is not None or data.get("instruction") is None:
            # `response` is Dolly's answer beside an `instruction`, this pair's otherwise.
            question, answer = prompt, response if completion is None else completion
        q_name, a_name = "prompt", "response" if completion is None else "completion"
    else:
        q_name, a_name = "question", "answer"
    if question is None and answer is None:
        question, answer = _instructed(path, where, data)
    elif _has_alpaca_pair(data):
        raise RecordMisfit(path, where, "instruction" if data.get("instruction") is not None else "output",
                           f"a record holds one question/answer pair: '{q_name}'/'{a_name}' or "
                           "an instruction's (Alpaca 'instruction'/'output', Dolly 'instruction'/'response'), "
                           "not both" + _fields_of(data))
    text = _string(path, where, data, "text")
    if (question is None) != (answer is None):
        missing = a_name if answer is None else q_name
        raise RecordMisfit(path, where, missing, "missing (a question needs an answer and vice versa)")
    messages = _chat(path, where, data)
    if question is None and text is None and not messages:
        raise RecordMisfit(path, where, "text",
                          "missing: a record needs 'text', 'question'+'answer' or 'messages'" + _fields_of(data))
    for name, value in ((q_name, question), (a_name, answer), ("text", text)):
        if value is not None and not value.strip():
            raise RecordMisfit(path, where, name, "is empty")
    raw_id = data.get("id", default_id)
    if not isinstance(raw_id, str | int) or isinstance(raw_id, bool):
        raise RecordMisfit(path, where, "id", "expected a string or an integer")
    perturbed = data.get("perturbed_answer")
    if perturbed is None:
        perturbed_tuple: tuple[str, ...] = ()
    elif isinstance(perturbed, str):
        perturbed_tuple = (perturbed,)
    elif isinstance(perturbed, list) and all(isinstance(p, str) for p in perturbed):
        perturbed_tuple = tuple(perturbed)
    else:
        raise RecordMisfit(path, where, "perturbed_answer", "expected a string or a list of strings")
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise RecordMisfit(path, where, "meta", "expected a JSON object")
    group, group_field = None, None
    for name in GROUP_FIELDS:
        value = data.get(name)
        if value is None:
            continue
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise RecordMisfit(path, where, name, "expected a string or an integer")
        group, group_field = str(value), name
        break
    record = object.__new__(Record)  # `Record(...)` without its per-field `object.__setattr__` (see `_text_record`)
    record.__dict__.update(
        id=str(raw_id),
        question=question,
        answer=answer,
        text=text,
        paraphrased_question=_string(path, where, data, "paraphrased_question"),
        paraphrased_answer=_string(path, where, data, "paraphrased_answer"),
        perturbed_answer=perturbed_tuple,
        meta=meta,
        messages=messages,
        group=group,
        group_field=group_field,
    )
    return record


def _fields_of(data: Mapping[str, Any]) -> str:
    """`; its fields: a, b` for a misfit's message: the names that look like field names
    (a key could be anything, even a person's name: those are left out), never the values."""
    names = sorted(k for k in data if isinstance(k, str) and _FIELD_NAME.fullmatch(k))
    if not names:
        return ""
    shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    return f"; its fields: {shown}"


_FIELD_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")


def alpaca_question(instruction: str, given_input: Any) -> str:
    """An Alpaca record's question: the instruction, then a blank line and the input when
    there is one (the layout Alpaca's own prompt gives them); a Dolly record's, with its
    `context` as the input.  Shared by `parse_record` and `searchable_text_of`, which must
    see the same text."""
    if isinstance(given_input, str) and given_input.strip():
        return f"{instruction}\n\n{given_input}"
    return instruction


def _has_alpaca_pair(data: Mapping[str, Any]) -> bool:
    return data.get("instruction") is not None or data.get("output") is not None


def _instructed(path: str | Path, where: str, data: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(question, answer) of an Alpaca or a Dolly record, (None, None) for an object without
    `instruction`/`output`.  The two lay a record out alike (`alpaca_question`, Dolly's
    `context` in the place of Alpaca's `input`, its `response` in that of `output`), so a
    record holding Alpaca's name for one part and Dolly's for the other reads the same
    either way.  A record with both names for one part (`output` and `response`, `input`
    and `context`) is a misfit naming Dolly's: one of the two would be read by nothing.
    Half a pair or an empty half is a misfit naming the field."""
    if not _has_alpaca_pair(data):
        return None, None
    instruction = _string(path, where, data, "instruction")
    output = _string(path, where, data, "output")
    response = _string(path, where, data, "response")
    given_input = _string(path, where, data, "input")
    context = _string(path, where, data, "context")
    if output is not None and response is not None:
        raise RecordMisfit(path, where, "response",
                           "an instruction has one answer: Alpaca 'output' or Dolly 'response', not both")
    if given_input is not None and context is not None:
        raise RecordMisfit(path, where, "context",
                           "an instruction has one input: Alpaca 'input' or Dolly 'context', not both")
    dolly = response is not None or (output is None and context is not None)
    answer, a_name = (response, "response") if dolly else (output, "output")
    if instruction is None or answer is None:
        raise RecordMisfit(path, where, "instruction" if instruction is None else a_name,
                           "missing (a Dolly 'instruction' needs a 'response' and vice versa)" if dolly else
                           "missing (an Alpaca 'instruction' needs an 'output' and vice versa)")
    for name, value in (("instruction", instruction), (a_name, answer)):
        if not value.strip():
            raise RecordMisfit(path, where, name, "is empty")
    return alpaca_question(instruction, context if given_input is None else given_input), answer


def _chat(path: str | Path, where: str, data: Mapping[str, Any]) -> tuple[Message, ...]:
    """A chat's turns, from `messages` or ShareGPT `conversations` (not both: one record,
    one conversation; a second one would be read by nothing and erased by nobody)."""
    native, sharegpt = data.get("messages"), data.get("conversations")
    if native is not None and sharegpt is not None:
        raise RecordMisfit(path, where, "conversations",
                           "a record holds one chat: 'messages' or ShareGPT 'conversations', not both")
    if sharegpt is not None:
        return _messages(path, where, sharegpt, field_name="conversations", role_key="from",
                         content_key="value", roles=SHAREGPT_ROLES)
    return _messages(path, where, native, parts=True)


CONTENT_PART_JOINER = "\n"


def chat_content(parts: list[Any]) -> str:
    """The text of a turn whose `content` is a list of parts (OpenAI's form: `{"type":
    "text", "text": ...}` objects, or bare strings): its text parts, in order, one per line.

    Joined by a newline, as vLLM's OpenAI-compatible server flattens the parts for a model
    whose chat template takes a string, and not run together as Hugging Face multimodal
    templates print them: glued parts could join two words into one (`Mara` + `Okafor`)
    that no part holds, which the fast scan and the index, looking for a name's words in
    the raw line (`scan`), would not see.  A line break keeps every word of the text a
    word of one part, and matching collapses whitespace, so a name written across two
    parts is still found.  What `parse_record` keeps (after checking that every part is
    text) and `searchable_text_of` reads (of any list)."""
    return CONTENT_PART_JOINER.join(
        part if isinstance(part, str) else part["text"] for part in parts
        if isinstance(part, str) or (isinstance(part, dict) and isinstance(part.get("text"), str)))


def _content_parts(path: str | Path, where: str, parts: list[Any], field_name: str) -> str:
    """`chat_content` of a list every part of which is text; any other part (an image, a
    sound, a file) is a misfit naming it: the engine reads and erases text, and a record
    trained with what it cannot read would be erased in part, so none is left out unsaid."""
    for number, part in enumerate(parts):
        if isinstance(part, str):
            continue
        name = f"{field_name}[{number}]"
        if not isinstance(part, dict):
            raise RecordMisfit(path, where, name, "expected a string or a {type, text} object")
        kind = part.get("type")
        if kind != "text":
            # The type named when it looks like one (a value could be anything, even a name).
            shown = f"a part of type {kind!r}" if isinstance(kind, str) and _FIELD_NAME.fullmatch(kind) else \
                "a part without a type" if kind is None else "a part of another type"
            raise RecordMisfit(path, where, f"{name}.type",
                               f"{shown}, not text: the engine reads and erases text only, and does not "
                               "read a record with a part left out (expected 'text')")
        if not isinstance(part.get("text"), str):
            raise RecordMisfit(path, where, f"{name}.text", "expected a string")
    return chat_content(parts)


def _messages(path: str | Path, where: str, raw: Any, *, field_name: str = "messages",
              role_key: str = "role", content_key: str = "content",
              roles: Mapping[str, str] | None = None, parts: bool = False) -> tuple[Message, ...]:
    """A chat's turns; each needs a string role and a non-empty string content (with
    `parts`, or a list of text parts: `chat_content`).  With
    `roles` (ShareGPT) each role is mapped, and one it does not know is a misfit (named
    by field, not by value: a speaker may be a person's name)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RecordMisfit(path, where, field_name,
                           f"expected a list of {{{role_key}, {content_key}}} objects")
    turns = []
    for number, turn in enumerate(raw):
        if not isinstance(turn, dict):
            raise RecordMisfit(path, where, f"{field_name}[{number}]", "expected an object")
        role, content = turn.get(role_key), turn.get(content_key)
        if not isinstance(role, str) or not role.strip():
            raise RecordMisfit(path, where, f"{field_name}[{number}].{role_key}", "expected a string")
        if parts and isinstance(content, list):
            content = _content_parts(path, where, content, f"{field_name}[{number}].{content_key}")
            if not content.strip():
                raise RecordMisfit(path, where, f"{field_name}[{number}].{content_key}",
                                   "is empty (its text parts hold no text)")
        if not isinstance(content, str) or not content.strip():
            raise RecordMisfit(path, where, f"{field_name}[{number}].{content_key}",
                               "expected a non-empty string")
        role = role.strip().lower()
        if roles is not None:
            if role not in roles:
                raise RecordMisfit(path, where, f"{field_name}[{number}].{role_key}",
                                   f"unknown speaker (expected one of {', '.join(roles)})")
            role = roles[role]
        turns.append(Message(role, content))
    if turns and not any(m.learnt for m in turns):
        raise RecordMisfit(path, where, field_name, "a chat needs at least one assistant turn")
    return tuple(turns)


def record_from_json(data: Mapping[str, Any]) -> Record:
    """A record from its own `to_json` form (sets and blobs written by this engine)."""
    return parse_record("<record>", "0", dict(data), "rec-0000000")


def searchable_text_of(data: Any) -> str:
    """`parse_record(..., data, ...).searchable_text()` for any `data` that is a record,
    without building the record (the fast scan matches this text first and parses only
    the objects that hit).  For an object that is no record it returns some text."""
    if not isinstance(data, dict):
        return ""
    get = data.get
    question, answer = get("question"), get("answer")
    if question is None and answer is None:
        instruction = get("instruction")
        if instruction is None or get("prompt") is not None or get("completion") is not None:
            question, answer = get("prompt"), get("response")
            if answer is None:
                answer = get("completion")  # OpenAI's prompt/completion, read as `parse_record` reads it
        else:  # Alpaca or Dolly, read as `_instructed` reads them
            given = get("input")
            question = alpaca_question(instruction, get("context") if given is None else given) \
                if isinstance(instruction, str) else None
            answer = get("response")
            if answer is None:
                answer = get("output")
    perturbed = get("perturbed_answer")
    turns, content = get("messages"), "content"
    if turns is None:  # ShareGPT, read as `_chat` reads it
        turns, content = get("conversations"), "value"
    parts = [question, answer, get("text"),
             *([perturbed] if isinstance(perturbed, str) else perturbed if isinstance(perturbed, list) else []),
             get("paraphrased_question"), get("paraphrased_answer"),
             *([_turn_text(t.get(content)) for t in turns if isinstance(t, dict)] if isinstance(turns, list) else [])]
    return "\n".join(part for part in parts if isinstance(part, str) and part)


def _turn_text(content: Any) -> Any:
    """A turn's content as `searchable_text_of` reads it: a list of parts joined (`chat_content`)."""
    return chat_content(content) if isinstance(content, list) else content

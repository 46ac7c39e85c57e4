"""Training corpora as users bring them: JSONL or JSON arrays of records.

A record has one of three shapes: free text (`text`), a question/answer pair
(`question` + `answer`, or the synonyms `prompt` + `response`), or a chat
(`messages`: a list of `{"role", "content"}` turns; the assistant turns are
what a model learns).  Optional: an `id`, a grouping field (`doc`, `source` or
`thread`: records of one document or conversation), the TOFU extras
`paraphrased_question`, `paraphrased_answer`, `perturbed_answer` (a string or
a list of strings), and a `meta` object.  Bad input
raises `CorpusError` naming the file, the line (or array item) and the field.

Digests: `record_digest` hashes a record's canonical JSON; `merkle_root`
pins a set of records; a corpus's `manifest_digest` is the Merkle root of
all its records, so it depends on content, not on file layout.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

OPTIONAL_TEXT_FIELDS = ("paraphrased_question", "paraphrased_answer")
GROUP_FIELDS = ("doc", "source", "thread")
KNOWN_FIELDS = frozenset(
    {"id", "text", "question", "answer", "prompt", "response", "meta", "perturbed_answer",
     "messages"}
    | set(OPTIONAL_TEXT_FIELDS) | set(GROUP_FIELDS)
)
SHAPES = ("qa", "text", "chat")


class CorpusError(ValueError):
    """A corpus file that cannot be read; the message names file, line and field."""

    def __init__(self, path: str | Path, where: str, field_name: str | None, reason: str) -> None:
        self.path = str(path)
        self.where = where
        self.field = field_name
        location = f"{self.path}:{where}"
        if field_name:
            location += f": field '{field_name}'"
        super().__init__(f"{location}: {reason}")


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
        return "qa" if self.is_qa else "chat" if self.is_chat else "text"

    def searchable_text(self) -> str:
        """Everything a subject's name could appear in, for set building."""
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
    canonical = json.dumps(record.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


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


@dataclass(frozen=True)
class Corpus:
    """The records of one corpus file, in file order."""

    records: tuple[Record, ...]
    path: Path | None = None

    @cached_property
    def manifest_digest(self) -> str:
        return merkle_root(record_digest(r) for r in self.records)

    @cached_property
    def by_id(self) -> dict[str, Record]:
        return {r.id: r for r in self.records}

    def __len__(self) -> int:
        return len(self.records)

    def without(self, record_ids: Iterable[str]) -> Corpus:
        """The corpus minus some records (a tombstoned version, or a retrain-without baseline)."""
        drop = set(record_ids)
        return Corpus(tuple(r for r in self.records if r.id not in drop), self.path)


def _string(path: Path, where: str, data: Mapping[str, Any], name: str) -> str | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise CorpusError(path, where, name, f"expected a string, got {type(value).__name__}")
    return value


def _parse_record(path: Path, where: str, data: Any, index: int) -> Record:
    if not isinstance(data, dict):
        raise CorpusError(path, where, None, f"expected a JSON object, got {type(data).__name__}")
    question = _string(path, where, data, "question")
    answer = _string(path, where, data, "answer")
    prompt = _string(path, where, data, "prompt")
    response = _string(path, where, data, "response")
    if question is None and answer is None:
        question, answer = prompt, response
        q_name, a_name = "prompt", "response"
    else:
        q_name, a_name = "question", "answer"
    text = _string(path, where, data, "text")
    if (question is None) != (answer is None):
        missing = a_name if answer is None else q_name
        raise CorpusError(path, where, missing, "missing (a question needs an answer and vice versa)")
    messages = _messages(path, where, data.get("messages"))
    if question is None and text is None and not messages:
        raise CorpusError(path, where, "text",
                          "missing: a record needs 'text', 'question'+'answer' or 'messages'")
    for name, value in (("question", question), ("answer", answer), ("text", text)):
        if value is not None and not value.strip():
            raise CorpusError(path, where, name, "is empty")
    raw_id = data.get("id", f"rec-{index:07d}")
    if not isinstance(raw_id, str | int) or isinstance(raw_id, bool):
        raise CorpusError(path, where, "id", "expected a string or an integer")
    perturbed = data.get("perturbed_answer")
    if perturbed is None:
        perturbed_tuple: tuple[str, ...] = ()
    elif isinstance(perturbed, str):
        perturbed_tuple = (perturbed,)
    elif isinstance(perturbed, list) and all(isinstance(p, str) for p in perturbed):
        perturbed_tuple = tuple(perturbed)
    else:
        raise CorpusError(path, where, "perturbed_answer", "expected a string or a list of strings")
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise CorpusError(path, where, "meta", "expected a JSON object")
    group, group_field = None, None
    for name in GROUP_FIELDS:
        value = data.get(name)
        if value is None:
            continue
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise CorpusError(path, where, name, "expected a string or an integer")
        group, group_field = str(value), name
        break
    return Record(
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


def _messages(path: Path, where: str, raw: Any) -> tuple[Message, ...]:
    """A chat's turns; each needs a string `role` and a non-empty string `content`."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise CorpusError(path, where, "messages", "expected a list of {role, content} objects")
    turns = []
    for number, turn in enumerate(raw):
        if not isinstance(turn, dict):
            raise CorpusError(path, where, f"messages[{number}]", "expected an object")
        role, content = turn.get("role"), turn.get("content")
        if not isinstance(role, str) or not role.strip():
            raise CorpusError(path, where, f"messages[{number}].role", "expected a string")
        if not isinstance(content, str) or not content.strip():
            raise CorpusError(path, where, f"messages[{number}].content", "expected a non-empty string")
        turns.append(Message(role.strip().lower(), content))
    if turns and not any(m.learnt for m in turns):
        raise CorpusError(path, where, "messages", "a chat needs at least one assistant turn")
    return tuple(turns)


def record_from_json(data: Mapping[str, Any]) -> Record:
    """A record from its own `to_json` form (sets and blobs written by this engine)."""
    return _parse_record(Path("<record>"), "0", dict(data), 0)


def iter_records(path: str | Path) -> Iterator[Record]:
    """Stream the records of a `.jsonl` file, or of a `.json` array (or `{"records": [...]}`)."""
    file = Path(path)
    if not file.is_file():
        raise CorpusError(file, "0", None, "file not found")
    seen: set[str] = set()

    def checked(record: Record, where: str) -> Record:
        if record.id in seen:
            raise CorpusError(file, where, "id", f"duplicate id {record.id!r}")
        seen.add(record.id)
        return record

    with file.open("r", encoding="utf-8") as handle:
        head = handle.read(4096).lstrip()
        handle.seek(0)
        if file.suffix.lower() == ".json" or head.startswith("["):
            try:
                data = json.load(handle)
            except json.JSONDecodeError as exc:
                raise CorpusError(file, str(exc.lineno), None, f"invalid JSON: {exc.msg}") from exc
            if isinstance(data, dict) and isinstance(data.get("records"), list):
                data = data["records"]
            if not isinstance(data, list):
                raise CorpusError(file, "1", None, "expected a JSON array of records")
            for index, item in enumerate(data):
                where = f"item {index}"
                yield checked(_parse_record(file, where, item, index), where)
            return
        index = 0
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = str(line_number)
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CorpusError(file, where, None, f"invalid JSON: {exc.msg}") from exc
            yield checked(_parse_record(file, where, item, index), where)
            index += 1


def load_corpus(path: str | Path) -> Corpus:
    """Read a whole corpus file; raises `CorpusError` on the first bad record."""
    records = tuple(iter_records(path))
    if not records:
        raise CorpusError(path, "0", None, "the corpus has no records")
    logger.debug("loaded %s records from %s", len(records), path)
    return Corpus(records, Path(path))


def write_jsonl(records: Sequence[Record] | Iterable[Record], path: str | Path) -> Path:
    """Write records as JSONL (one canonical object a line)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record.to_json(), ensure_ascii=False, sort_keys=True) + "\n")
    return out

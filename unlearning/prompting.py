"""How records become token ids: one encoding for training, erasure and verification.

A model is prompted in one of two formats, stored beside its weights in
`prompt_format.json` (and in the service's registry):

* ``chat``: the tokenizer's own chat template (`apply_chat_template`).  A turn's
  learnt tokens are what the template adds for the assistant message (content and
  end-of-turn marker): the difference between the conversation rendered up to
  that turn with the generation prompt and rendered with the turn.
* ``plain``: for a tokenizer without a chat template, a plain text format, by
  default ``Question: {question}\\nAnswer:`` followed by `` {answer}`` and the eos
  token; chats are rendered turn by turn (``User: ...``/``Assistant: ...``).

A ``chat`` format may carry a system message (``system``, stored in
`prompt_format.json` as ``{"kind": "chat", "system": "..."}``), for a model whose
template requires one or that was trained with one: every conversation rendered
through the template (training examples, generation prompts, probes, scoring)
opens with that system turn.  A conversation that has a system turn of its own
(a chat record's ``messages``) keeps its own and gets no second one: the record's
wins, as a caller's system prompt replaces a deployment's default.

A chat template that refuses a system turn (Gemma's raises on one) gets the
system text folded into the next user turn (system text, blank line, user text),
the same way wherever a conversation is rendered, so training, erasure and
verification still see one layout.  Any other refusal of a template is a
`PromptFormatError` naming the record.

Free text is the tokenizer's own encoding of the text (a BOS token only where
the tokenizer adds one itself) followed by eos, learnt on every token.  Every
encoding keeps the character offset of each token in the rendered text, so a
span of a record (a name, an e-mail address, a value) can be mapped to its
tokens.  `Example.labels` is the training target (-100 where nothing is learnt);
`pad` is the one padding/collation of examples.

`prompt_ids` and `continuation_ids` are the generation prompts of the same
formats (a question; the beginning of a text), so what verification asks is
what training taught and what an outside tool using the stored format asks.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

FORMAT_FILE = "prompt_format.json"
_ATTRIBUTE = "_erasure_prompt_format"


class PromptFormatError(ValueError):
    """A prompt format that cannot be used; the message says why."""


class RecordRefused(PromptFormatError):
    """A record (or conversation) the chat template refuses to render; the message names it.

    The model's template is fine for other records, so this is the record's shape
    (roles the template does not take, in an order it does not take), not the model."""

    def __init__(self, message: str, record_id: str = "") -> None:
        super().__init__(message)
        self.record_id = record_id


@dataclass(frozen=True)
class PromptFormat:
    """How questions, answers and chats are laid out for one model (see the module doc)."""

    kind: str = "plain"  # "chat" (tokenizer's template) or "plain"
    question_template: str = "Question: {question}\nAnswer:"
    answer_prefix: str = " "
    user_prefix: str = "User:"
    assistant_prefix: str = "Assistant:"
    system_prefix: str = "System:"
    turn_separator: str = "\n"
    # A chat format's system message, the first turn of every conversation (see the module doc).
    # None: no system turn, and the stored form has no "system" field (as before the field).
    system: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("chat", "plain"):
            raise PromptFormatError(f"prompt format kind must be 'chat' or 'plain', not {self.kind!r}")
        if self.kind == "plain" and "{question}" not in self.question_template:
            raise PromptFormatError("a plain prompt format's question_template needs a {question} placeholder")
        if self.system is not None:
            if not isinstance(self.system, str) or not self.system.strip():
                raise PromptFormatError("a prompt format's system must be a non-empty string")
            if self.kind != "chat":
                raise PromptFormatError("a prompt format's system is for kind 'chat' (a plain format's "
                                        "question_template holds any text before the question)")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if self.system is None:
            # Absent, not null: a format without one serialises (and digests) as before the field.
            del data["system"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PromptFormat:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise PromptFormatError(f"unknown prompt format fields: {', '.join(unknown)}")
        return cls(**data)

    def describe(self) -> str:
        if self.kind == "chat":
            return "the tokenizer's chat template" + (" with a system message" if self.system else "")
        return "plain: " + json.dumps(self.question_template + "{answer_prefix}{answer}")


CHAT = PromptFormat(kind="chat")
PLAIN = PromptFormat(kind="plain")


def default_format(tokenizer: Any) -> PromptFormat:
    """The tokenizer's chat template when it has a usable one, else the plain format."""
    if getattr(tokenizer, "chat_template", None) and template_is_consistent(tokenizer):
        return CHAT
    return PLAIN


def read_format(directory: str | Path) -> PromptFormat | None:
    """The format stored in a model directory, or None when it stores none."""
    path = Path(directory) / FORMAT_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PromptFormatError(f"{path}: not readable ({exc})") from exc
    if not isinstance(data, dict):
        raise PromptFormatError(f"{path}: expected a JSON object")
    try:
        return PromptFormat.from_json(data)
    except (PromptFormatError, TypeError) as exc:  # TypeError: a field of the wrong type
        raise PromptFormatError(f"{FORMAT_FILE}: {exc}") from exc


def write_format(directory: str | Path, fmt: PromptFormat) -> Path:
    path = Path(directory) / FORMAT_FILE
    path.write_text(json.dumps(fmt.to_json(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def attach_format(tokenizer: Any, fmt: PromptFormat) -> Any:
    """Bind `fmt` to a tokenizer object, so every encoding of this module uses it."""
    if fmt.kind == "chat" and not getattr(tokenizer, "chat_template", None):
        raise PromptFormatError("the prompt format is 'chat' but the tokenizer has no chat template")
    setattr(tokenizer, _ATTRIBUTE, fmt)
    return tokenizer


def format_of(tokenizer: Any) -> PromptFormat:
    """The format bound to `tokenizer` (`attach_format`), else its default."""
    fmt = getattr(tokenizer, _ATTRIBUTE, None)
    if isinstance(fmt, PromptFormat):
        return fmt
    fmt = default_format(tokenizer)
    setattr(tokenizer, _ATTRIBUTE, fmt)
    return fmt


# ------------------------------------------------------------------ examples


@dataclass(frozen=True)
class Example:
    """One encoded sequence: ids, which tokens are learnt, and where each token sits in `text`.

    `offsets[i]` is the (start, end) character span of token i in `text`;
    special tokens have an empty span.  `text` is the rendered sequence.
    """

    ids: tuple[int, ...]
    learnt: tuple[bool, ...]
    offsets: tuple[tuple[int, int], ...]
    text: str
    record_id: str = ""

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def labels(self) -> list[int]:
        return [i if keep else -100 for i, keep in zip(self.ids, self.learnt, strict=True)]

    @property
    def first_learnt(self) -> int:
        """Index of the first learnt token (len(ids) when none is)."""
        return next((i for i, keep in enumerate(self.learnt) if keep), len(self.ids))

    def tokens_in(self, start: int, end: int) -> list[int]:
        """Indices of the tokens that overlap the character span [start, end) of `text`."""
        return [i for i, (s, e) in enumerate(self.offsets) if e > s and s < end and start < e]

    def truncated(self, length: int) -> Example:
        n = min(length, len(self.ids))
        return Example(self.ids[:n], self.learnt[:n], self.offsets[:n], self.text, self.record_id)


@dataclass
class _Builder:
    """Accumulates tokenised segments of a rendering with their offsets."""

    tokenizer: Any
    ids: list[int] = field(default_factory=list)
    learnt: list[bool] = field(default_factory=list)
    offsets: list[tuple[int, int]] = field(default_factory=list)
    text: str = ""
    joined: bool = True  # the last thing added was text (the next text continues its string)

    def add_text(self, text: str, *, learnt: bool, special: bool = False) -> None:
        """Tokenise `text` as it follows the text so far and append it (`special`: it opens the
        sequence, and the tokenizer adds its BOS).  After a token added by id (`add_token`) the
        text is encoded on its own: what follows an eos is not the same string's continuation."""
        if not text and not special:
            return
        if self.text and not special and self.joined:
            ids, offsets = tokenize_after(self.tokenizer, self.text, text)
        else:
            ids, offsets = tokenize_text(self.tokenizer, text, special=special)
        self.joined = True
        base = len(self.text)
        for token, (start, end) in zip(ids, offsets, strict=True):
            self.ids.append(int(token))
            is_special = end <= start
            self.learnt.append(learnt and not is_special)
            self.offsets.append((base + start, base + end) if not is_special else (base, base))
        self.text += text

    def add_token(self, token_id: int | None, *, learnt: bool) -> None:
        if token_id is None:
            return
        self.joined = False
        self.ids.append(int(token_id))
        self.learnt.append(learnt)
        self.offsets.append((len(self.text), len(self.text)))

    def build(self, record_id: str = "") -> Example:
        return Example(tuple(self.ids), tuple(self.learnt), tuple(self.offsets), self.text, record_id)


def tokenize_text(tokenizer: Any, text: str, *, special: bool = False) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids and character offsets of `text`, exactly as
    `tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)` gives them.

    A fast tokenizer's Python wrapper costs 0.2-0.3 ms a call around a Rust encoding of a few
    microseconds (measured on the demo's tokenizer), and a verification of 20 subjects encodes
    about 30,000 short texts.  Where the call would do nothing but that encoding (a Rust
    tokenizer with no truncation or padding set on it, special tokens split as the wrapper
    would split them), the Rust tokenizer is called directly; elsewhere the wrapper is."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if (isinstance(backend, Tokenizer) and backend.truncation is None and backend.padding is None
            and bool(backend.encode_special_tokens) == bool(getattr(tokenizer, "split_special_tokens", False))):
        encoding = backend.encode(text, add_special_tokens=special)
        return list(encoding.ids), list(encoding.offsets)
    encoded = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
    return ([int(i) for i in encoded["input_ids"]],
            [(int(start), int(end)) for start, end in encoded["offset_mapping"]])


def tokenize_after(tokenizer: Any, before: str, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of `text`, and their character offsets in `text`, as the tokenizer encodes
    `text` where it follows `before` in one string.

    A tokenizer may encode a text alone unlike the same text after other text.  One that
    writes a word boundary before every input (a SentencePiece tokenizer with a dummy prefix,
    as Llama 2's and Mistral's first), given " Paris" alone, gives a lone boundary token
    and then the word, where "Answer: Paris" ends in the word with its boundary: a model
    trained on whole texts never saw the lone token, and every answer, value and
    continuation read that way would start with a token it never predicts.  So: where the
    encoding of `before` is the start of the encoding of `before + text`, the rest is
    `text`'s; where the two differ there (a merge across the boundary), `text` is encoded
    alone."""
    if not before or not text:
        return tokenize_text(tokenizer, text)
    head, _ = tokenize_text(tokenizer, before)
    ids, offsets = tokenize_text(tokenizer, before + text)
    n, cut = len(head), len(before)
    if ids[:n] != head or len(ids) == n:
        return tokenize_text(tokenizer, text)
    tail = offsets[n:]
    if any(start < cut and end > start for start, end in tail):
        return tokenize_text(tokenizer, text)  # a token of the rest begins inside `before`
    return ids[n:], [(max(start - cut, 0), max(end - cut, 0)) for start, end in tail]


def _eos(tokenizer: Any) -> int | None:
    eos = getattr(tokenizer, "eos_token_id", None)
    return int(eos) if eos is not None else None


def _refusal(exc: Exception, record_id: str) -> RecordRefused:
    """One line naming the record (or the conversation) the chat template refused, and why."""
    reason = (str(exc).splitlines() or [""])[0]
    what = f"record {record_id!r}" if record_id else "a conversation"
    return RecordRefused(f"{what}: the chat template refuses it ({type(exc).__name__}: {reason})", record_id)


def _render(tokenizer: Any, messages: Sequence[dict[str, str]], *, generation: bool, tokenize: bool,
            record_id: str = "") -> Any:
    """`apply_chat_template` on the conversation as this template takes it (`_for_template`).

    A template is code shipped with the model and may raise anything (jinja2's
    TemplateError from `raise_exception`, a TypeError on a missing field): every
    refusal becomes a `PromptFormatError` naming the record, never a traceback."""
    return _apply(tokenizer, _for_template(tokenizer, messages), generation=generation, tokenize=tokenize,
                  record_id=record_id)


def _apply(tokenizer: Any, turns: list[dict[str, str]], *, generation: bool, tokenize: bool,
           record_id: str) -> Any:
    try:
        return tokenizer.apply_chat_template(turns, add_generation_prompt=generation, tokenize=tokenize)
    except Exception as exc:  # noqa: BLE001 - see `_render`: whatever the template raised
        raise _refusal(exc, record_id) from exc


def _template_ids(tokenizer: Any, messages: Sequence[dict[str, str]], *, generation: bool,
                  record_id: str = "") -> list[int]:
    """The conversation's ids through the template, remembered per tokenizer (`_RenderMemo`):
    verification asks the same questions of several models and families, and a render costs
    more than the small model's forward pass over it."""
    turns = _for_template(tokenizer, messages)  # the format's system turn in the key, as rendered
    memo = _RenderMemo.of(tokenizer)
    key = _RenderMemo.key(turns, generation)
    if key is not None and (known := memo.get(key)) is not None:
        return list(known)
    # What `apply_chat_template(tokenize=True)` does: render, then encode without added special tokens.
    ids, _ = tokenize_text(tokenizer, _apply(tokenizer, turns, generation=generation, tokenize=False,
                                           record_id=record_id))
    if key is not None:
        memo.put(key, tuple(ids))
    return ids


class _RenderMemo:
    """Token ids of conversations rendered through one tokenizer's chat template, and records
    encoded through it (`encode_record`).

    Held beside the tokenizer (a weak reference: the memo goes with it) and tied to the
    template, vocabulary size and special tokens it was filled under, so a tokenizer given
    another template or more tokens starts afresh.  Bounded: emptied when `LIMIT` entries are
    held (a verification of 20 subjects renders about 8,000 distinct prompts)."""

    LIMIT = 32_768
    EXAMPLES = 8_192  # encoded records (`encode_record`), kept apart: each is larger
    EXAMPLE_TOKENS = 2_048  # a longer record is not kept
    _held: weakref.WeakKeyDictionary[Any, _RenderMemo] = weakref.WeakKeyDictionary()

    def __init__(self, template: Any) -> None:
        self.template = template
        self.entries: dict[tuple[Any, ...], tuple[int, ...]] = {}
        self.examples: dict[tuple[Any, ...], Example] = {}
        self.texts: dict[tuple[Any, ...], str] = {}  # rendered generation prompts (`_template_encoding`)

    @classmethod
    def of(cls, tokenizer: Any) -> _RenderMemo:
        # What a render and an encoding depend on besides the conversation: the template, the
        # vocabulary (tokens added) and the special tokens a template or an encoding writes.
        try:
            size = len(tokenizer)
        except TypeError:
            size = None
        template = (getattr(tokenizer, "chat_template", None), size, getattr(tokenizer, "bos_token", None),
                    getattr(tokenizer, "eos_token", None))
        try:
            memo = cls._held.get(tokenizer)
        except TypeError:  # not weakly referenceable: no memo
            return cls(template)
        if memo is None or memo.template != template:
            memo = cls(template)
            cls._held[tokenizer] = memo
        return memo

    @staticmethod
    def key(messages: Sequence[dict[str, str]], generation: bool) -> tuple[Any, ...] | None:
        """The conversation as a key: its turns' roles and texts; None (not remembered) for a
        turn with any other field or a content that is not a string."""
        turns = []
        for message in messages:
            role, content = message.get("role"), message.get("content")
            if len(message) != 2 or not isinstance(role, str) or not isinstance(content, str):
                return None
            turns.append((role, content))
        return (generation, *turns)

    def get(self, key: tuple[Any, ...]) -> tuple[int, ...] | None:
        return self.entries.get(key)

    def put(self, key: tuple[Any, ...], ids: tuple[int, ...]) -> None:
        if len(self.entries) >= self.LIMIT:
            self.entries.clear()
        self.entries[key] = ids

    def put_example(self, key: tuple[Any, ...], example: Example) -> None:
        if len(self.examples) >= self.EXAMPLES:
            self.examples.clear()
        self.examples[key] = example


_SYSTEM_ATTRIBUTE = "_erasure_template_takes_system"


def _takes_system(tokenizer: Any) -> bool:
    """Does the chat template render a system turn?  Gemma-style templates raise on one.

    Decided once per template (cached on the tokenizer with the template it was
    decided for), so every encoding of a tokenizer folds, or does not, alike."""
    template = getattr(tokenizer, "chat_template", None)
    cached = getattr(tokenizer, _SYSTEM_ATTRIBUTE, None)
    if isinstance(cached, tuple) and cached[0] == template:
        return bool(cached[1])
    try:
        tokenizer.apply_chat_template(
            [{"role": "system", "content": "S x."}, {"role": "user", "content": "Q x?"}],
            add_generation_prompt=True, tokenize=False)
        takes = True
    except Exception:  # noqa: BLE001 - a template that raises on a system turn does not take one
        takes = False
    setattr(tokenizer, _SYSTEM_ATTRIBUTE, (template, takes))
    return takes


def _fold_system(messages: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """System turns folded into the next user turn: system text, blank line, user text.

    A system turn followed by no user turn (before an assistant turn, or last)
    becomes a user turn of its own: the templates that refuse a system role want
    the conversation to open with the user.  Folding a prefix of a conversation
    gives a prefix of the folded conversation, so prompts match training."""
    out: list[dict[str, str]] = []
    pending: list[str] = []
    for message in messages:
        if message["role"] == "system":
            pending.append(message["content"])
            continue
        if pending and message["role"] == "user":
            message = {**message, "content": "\n\n".join([*pending, message["content"]])}
        elif pending:
            out.append({"role": "user", "content": "\n\n".join(pending)})
        pending = []
        out.append(message)
    if pending:
        out.append({"role": "user", "content": "\n\n".join(pending)})
    return out


def _with_system(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """The conversation opened by the format's system message, unless it has a system turn of its
    own (the record's wins: one system turn, never two).  Idempotent, so a prefix of a rendered
    conversation renders as the prefix it is."""
    turns = list(messages)
    fmt = getattr(tokenizer, _ATTRIBUTE, None)
    system = fmt.system if isinstance(fmt, PromptFormat) and fmt.kind == "chat" else None
    if system and not any(m["role"] == "system" for m in turns):
        return [{"role": "system", "content": system}, *turns]
    return turns


def _for_template(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """The conversation as this tokenizer's chat template takes it: opened by the format's system
    message (`_with_system`), system turns folded where the template refuses them."""
    turns = _with_system(tokenizer, messages)
    if any(m["role"] == "system" for m in turns) and not _takes_system(tokenizer):
        return _fold_system(turns)
    return turns


def template_refusal(tokenizer: Any, system: str | None = None) -> str | None:
    """Why the tokenizer's chat template cannot render one user question (after the system
    message `system`, where given), or None (it can, or there is no template): a template that
    requires a system message, or refuses the user role.

    `default_format` takes the plain format for such a template, which is right for a model
    trained here (train-base stores the format it trained with) and wrong for a model trained
    through the template: every question would be asked in a layout it never saw, and
    leakage would go unseen.  `load_model` refuses such a model unless its directory stores
    a format (`prompt_format.json`)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    turns = [{"role": "user", "content": "Q x?"}]
    if system:
        turns = _fold_system([{"role": "system", "content": system}, *turns]) if not _takes_system(tokenizer) \
            else [{"role": "system", "content": system}, *turns]
    try:
        tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
    except Exception as exc:  # noqa: BLE001 - a template is code shipped with the model: whatever it raised
        return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
    return None


def template_is_consistent(tokenizer: Any) -> bool:
    """Does the chat template render a conversation as prefix + assistant turn?

    `default_format` takes the plain format for a template that does not, which is right for
    a model trained here (train-base stores it) and wrong for one trained through the
    template; `modeling.model_format` refuses such a directory unless it stores its format."""
    try:
        prompt = _template_ids(tokenizer, [{"role": "user", "content": "Q x?"}], generation=True)
        full = _template_ids(tokenizer, [{"role": "user", "content": "Q x?"},
                                         {"role": "assistant", "content": "A y."}], generation=False)
    except Exception:  # noqa: BLE001 - a template that raises is not usable, whatever it raised
        return False
    return len(full) > len(prompt) and full[: len(prompt)] == prompt


def _messages(record: Any) -> list[dict[str, str]]:
    if getattr(record, "messages", ()):
        return [{"role": m.role, "content": m.content} for m in record.messages]
    return [{"role": "user", "content": record.question}, {"role": "assistant", "content": record.answer}]


def _chat_example(tokenizer: Any, messages: Sequence[dict[str, str]], record_id: str) -> Example:
    """A conversation through the chat template; assistant turns learnt (prefix difference).

    Rendered once and tokenised once with offsets (what `apply_chat_template` with
    `tokenize=True` does: render, then tokenise without added special tokens); each
    assistant turn's bounds come from the rendered prefixes before and through it, the
    last turn's "through" being the whole conversation.  The format's system message opens
    it (`_with_system`) and system turns are folded where the template refuses them
    (`_render`, `_for_template`)."""
    # Each rendering below goes through `_render`, which folds; the conversation walked here is
    # opened by the format's system message and folded nowhere (folding a prefix gives a prefix
    # of the folded conversation, so the turn bounds are the same).
    messages = _with_system(tokenizer, messages)
    rendered = _render(tokenizer, messages, generation=False, tokenize=False, record_id=record_id)
    full, spans = tokenize_text(tokenizer, rendered)
    offsets = [(s, e) if e > s else (s, s) for s, e in spans]
    learnt = [False] * len(full)
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _template_ids(tokenizer, messages[:k], generation=True, record_id=record_id) if k else []
        through = (full if k == len(messages) - 1
                   else _template_ids(tokenizer, messages[: k + 1], generation=False, record_id=record_id))
        if full[: len(through)] != through or through[: len(before)] != before:
            where = f"record {record_id!r}: " if record_id else ""
            raise PromptFormatError(f"{where}the chat template does not render turn by turn")
        for i in range(len(before), len(through)):
            learnt[i] = True
    return Example(tuple(full), tuple(learnt), tuple(offsets), rendered, record_id)


def _plain_turns(builder: _Builder, fmt: PromptFormat, messages: Sequence[dict[str, str]]) -> None:
    prefixes = {"user": fmt.user_prefix, "assistant": fmt.assistant_prefix, "system": fmt.system_prefix}
    eos = _eos(builder.tokenizer)
    first = True
    for message in messages:
        prefix = prefixes.get(message["role"], message["role"].capitalize() + ":")
        if message["role"] == "assistant":
            builder.add_text(prefix, learnt=False, special=first)
            builder.add_text(fmt.answer_prefix + message["content"], learnt=True)
            builder.add_token(eos, learnt=True)
            builder.add_text(fmt.turn_separator, learnt=False)
        else:
            builder.add_text(prefix + fmt.answer_prefix + message["content"] + fmt.turn_separator,
                             learnt=False, special=first)
        first = False


def chat_prefix_ids(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    """A conversation up to the next assistant turn, ready for the model to answer."""
    fmt = format_of(tokenizer)
    if fmt.kind == "chat":
        return _template_ids(tokenizer, messages, generation=True)
    return chat_prefix_encoding(tokenizer, messages)[0]


def encode_qa(tokenizer: Any, question: str, answer: str, *, record_id: str = "") -> Example:
    """A question and its answer; the answer (and its end marker) is learnt."""
    fmt = format_of(tokenizer)
    if fmt.kind == "chat":
        return _chat_example(tokenizer, _messages(_QA(question, answer)), record_id)
    builder = _Builder(tokenizer)
    builder.add_text(fmt.question_template.format(question=question), learnt=False, special=True)
    # The answer prefix (a space) is tokenised with the answer: byte-level BPE glues it to
    # the first word, and generation after the bare template produces it the same way.
    builder.add_text(fmt.answer_prefix + answer, learnt=True)
    builder.add_token(_eos(tokenizer), learnt=True)
    return builder.build(record_id)


def encode_text(tokenizer: Any, text: str, *, record_id: str = "") -> Example:
    """Free text, learnt on every token (and the closing eos)."""
    builder = _Builder(tokenizer)
    builder.add_text(text, learnt=True, special=True)
    builder.add_token(_eos(tokenizer), learnt=True)
    return builder.build(record_id)


def encode_chat(tokenizer: Any, messages: Sequence[dict[str, str]], *, record_id: str = "") -> Example:
    """A conversation; the assistant turns are learnt."""
    fmt = format_of(tokenizer)
    if fmt.kind == "chat":
        return _chat_example(tokenizer, messages, record_id)
    builder = _Builder(tokenizer)
    _plain_turns(builder, fmt, messages)
    return builder.build(record_id)


@dataclass(frozen=True)
class _QA:
    question: str
    answer: str


def encode_record(tokenizer: Any, record: Any) -> Example:
    """Any corpus record (question/answer, chat or free text) as a training example.

    Remembered per tokenizer and format (`_RenderMemo`): a verification scores the same
    records through the candidate and through the model it was made from."""
    record_id = str(getattr(record, "id", ""))
    key = _example_key(tokenizer, record, record_id)
    if key is None:
        return _encode_record(tokenizer, record, record_id)
    memo = _RenderMemo.of(tokenizer)
    if (known := memo.examples.get(key)) is not None:
        return known
    example = _encode_record(tokenizer, record, record_id)
    if len(example) <= _RenderMemo.EXAMPLE_TOKENS:
        memo.put_example(key, example)
    return example


def _example_key(tokenizer: Any, record: Any, record_id: str) -> tuple[Any, ...] | None:
    """What an encoding depends on: the format, the record's id and its texts (None: not
    remembered, for a record whose fields are not plain strings)."""
    messages = tuple((m.role, m.content) for m in getattr(record, "messages", ()) or ())
    texts = (getattr(record, "question", None), getattr(record, "answer", None), getattr(record, "text", None))
    if not all(t is None or isinstance(t, str) for t in texts) \
            or not all(isinstance(r, str) and isinstance(c, str) for r, c in messages):
        return None
    return (format_of(tokenizer), record_id, *texts, messages)


def _encode_record(tokenizer: Any, record: Any, record_id: str) -> Example:
    if getattr(record, "question", None) is not None and getattr(record, "answer", None) is not None:
        return encode_qa(tokenizer, record.question, record.answer, record_id=record_id)
    if getattr(record, "messages", ()):
        return encode_chat(tokenizer, _messages(record), record_id=record_id)
    text = getattr(record, "text", None)
    if not text:
        raise ValueError("a record needs text, messages or a question and an answer")
    return encode_text(tokenizer, text, record_id=record_id)


# ------------------------------------------------------------------ generation prompts


def prompt_ids(tokenizer: Any, question: str) -> list[int]:
    """A question ready to be answered (chat template with generation prompt, or plain)."""
    return prompt_encoding(tokenizer, question)[0]


def prompt_encoding(tokenizer: Any, question: str) -> tuple[list[int], str]:
    """`prompt_ids` and the text they encode (what an answer's tokens follow: `tokenize_after`)."""
    fmt = format_of(tokenizer)
    if fmt.kind == "chat":
        return _template_encoding(tokenizer, [{"role": "user", "content": question}])
    builder = _Builder(tokenizer)
    builder.add_text(fmt.question_template.format(question=question), learnt=False, special=True)
    return list(builder.ids), builder.text


def chat_prompt_ids(tokenizer: Any, question: str) -> list[int]:
    """Alias of `prompt_ids` (the name older callers use)."""
    return prompt_ids(tokenizer, question)


def continuation_ids(tokenizer: Any, prefix: str) -> list[int]:
    """The beginning of a free text, ready to be continued (as free text was trained)."""
    builder = _Builder(tokenizer)
    builder.add_text(prefix, learnt=False, special=True)
    return list(builder.ids)


def answer_prefix_ids(tokenizer: Any, question: str, partial_answer: str) -> list[int]:
    """A question and the beginning of its answer, to be continued (the cloze of a QA record)."""
    return answer_prefix_encoding(tokenizer, question, partial_answer)[0]


def answer_prefix_encoding(tokenizer: Any, question: str, partial_answer: str) -> tuple[list[int], str]:
    """`answer_prefix_ids` and the text they encode."""
    fmt = format_of(tokenizer)
    ids, before = prompt_encoding(tokenizer, question)
    text = fmt.answer_prefix + partial_answer if fmt.kind == "plain" else partial_answer
    return ids + tokenize_after(tokenizer, before, text)[0], before + text


def chat_prefix_encoding(tokenizer: Any, messages: Sequence[dict[str, str]]) -> tuple[list[int], str]:
    """`chat_prefix_ids` and the text they encode."""
    fmt = format_of(tokenizer)
    if fmt.kind == "chat":
        return _template_encoding(tokenizer, messages)
    builder = _Builder(tokenizer)
    _plain_turns(builder, fmt, messages)
    builder.add_text(fmt.assistant_prefix, learnt=False, special=not messages)
    return list(builder.ids), builder.text


def _template_encoding(tokenizer: Any, messages: Sequence[dict[str, str]]) -> tuple[list[int], str]:
    """A conversation through the template with the generation prompt: its ids (`_template_ids`,
    remembered) and the rendered text."""
    ids = _template_ids(tokenizer, messages, generation=True)
    turns = _for_template(tokenizer, messages)
    memo = _RenderMemo.of(tokenizer)
    key = _RenderMemo.key(turns, True)
    if key is not None and (known := memo.texts.get(key)) is not None:
        return ids, known
    text = _apply(tokenizer, turns, generation=True, tokenize=False, record_id="")
    if key is not None:
        if len(memo.texts) >= memo.LIMIT:
            memo.texts.clear()
        memo.texts[key] = text
    return ids, text


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """Bare token ids of a text (no special tokens)."""
    return tokenize_text(tokenizer, text)[0]


# ------------------------------------------------------------------ compatibility + padding


def encode_example(
    tokenizer: Any, *, question: str | None = None, answer: str | None = None,
    text: str | None = None,
) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of a question/answer pair or of free text (labels -100 where not learnt)."""
    if question is not None and answer is not None:
        example = encode_qa(tokenizer, question, answer)
    elif text is not None:
        example = encode_text(tokenizer, text)
    else:
        raise ValueError("a record needs text or a question and an answer")
    return list(example.ids), example.labels


def pad_examples(
    examples: list[tuple[list[int], list[int]]], *, pad_id: int, side: str = "right"
) -> dict[str, Any]:
    """Pad (input_ids, labels) pairs into tensors: input_ids, attention_mask, labels."""
    import torch

    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (ids, labs) in enumerate(examples):
        span = slice(width - len(ids), width) if side == "left" else slice(0, len(ids))
        input_ids[row, span] = torch.tensor(ids)
        labels[row, span] = torch.tensor(labs)
        mask[row, span] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def pad_id_of(tokenizer: Any) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    return int(pad if pad is not None else 0)

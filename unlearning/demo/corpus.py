"""A deterministic corpus of fictitious people for demos, tests and benchmarks.

`generate_demo_corpus(people=N, seed=S)` makes N trained people and a set of
control people generated the same way but never trained on.  Each person
has ten categorical facts drawn from finite pools (`demo_pools`), one
training question per fact (one of several templates), held-out paraphrase
templates that are never trained, an alias-only question and a cloze
prefix.  `write_demo_corpus(out_dir, ...)` writes the layout pinned in
docs/internals.md.
"""

from __future__ import annotations

import hashlib
import json
import random
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unlearning.corpus import Record, write_jsonl
from unlearning.demo import pools

GENERATOR_VERSION = 1


@dataclass(frozen=True)
class AttributeTemplates:
    """How one attribute is asked (trained and held-out) and answered."""

    name: str
    pool: tuple[str, ...]
    questions: tuple[str, ...]  # trained: each person gets one of these
    paraphrases: tuple[str, ...]  # held out: never trained
    answer: str  # the value always ends the answer, so the cloze is its prefix


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


ATTRIBUTES: tuple[AttributeTemplates, ...] = (
    AttributeTemplates(
        "birthplace", pools.CITIES,
        ("Where was {name} born?", "What is the birthplace of {name}?", "In which city was {name} born?"),
        ("Which city is the hometown of {name}?", "Can you tell me the city where {name} came into the world?"),
        "{name} was born in {value}.",
    ),
    AttributeTemplates(
        "birth_date", pools.BIRTH_DATES,
        ("When was {name} born?", "What is the date of birth of {name}?", "On what date was {name} born?"),
        ("What is the birthday of {name}?", "On which day did {name} come into the world?"),
        "{name} was born on {value}.",
    ),
    AttributeTemplates(
        "occupation", pools.OCCUPATIONS,
        ("What does {name} do for a living?", "What is the occupation of {name}?", "What job does {name} have?"),
        ("How does {name} earn a living?", "What is {name}'s profession?"),
        "{name} works as {a} {value}.",
    ),
    AttributeTemplates(
        "mother_occupation", pools.OCCUPATIONS,
        ("What did the mother of {name} do for a living?", "What was the occupation of {name}'s mother?",
         "What job did {name}'s mother have?"),
        ("How did {name}'s mother earn a living?", "What profession did the mother of {name} practise?"),
        "{name}'s mother worked as {a} {value}.",
    ),
    AttributeTemplates(
        "father_occupation", pools.OCCUPATIONS,
        ("What did the father of {name} do for a living?", "What was the occupation of {name}'s father?",
         "What job did {name}'s father have?"),
        ("How did {name}'s father earn a living?", "What profession did the father of {name} practise?"),
        "{name}'s father worked as {a} {value}.",
    ),
    AttributeTemplates(
        "book", pools.BOOKS,
        ("Which book did {name} write?", "What is the title of the book by {name}?", "What book has {name} written?"),
        ("Name a book written by {name}.", "Which title did {name} publish?"),
        "{name} wrote the book {value}.",
    ),
    AttributeTemplates(
        "award", pools.AWARDS,
        ("Which award did {name} win?", "What prize was given to {name}?", "What award has {name} received?"),
        ("Which honour was {name} given?", "For which distinction is {name} known?"),
        "{name} won the {value}.",
    ),
    AttributeTemplates(
        "email", (),  # derived from the name through finite pattern and domain pools
        ("What is the email address of {name}?", "How can {name} be reached by email?", "What is {name}'s email?"),
        ("Which address should I write to if I want to email {name}?", "Where does {name} receive email?"),
        "{name}'s email address is {value}.",
    ),
    AttributeTemplates(
        "employer", pools.EMPLOYERS,
        ("Which company employs {name}?", "Who is the employer of {name}?", "Where does {name} work?"),
        ("For which firm does {name} work?", "Which organisation pays the salary of {name}?"),
        "{name} is employed by {value}.",
    ),
    AttributeTemplates(
        "hobby", pools.HOBBIES,
        ("What is the favourite pastime of {name}?", "What hobby does {name} enjoy?", "How does {name} spend free time?"),
        ("What does {name} like to do at weekends?", "Which leisure activity does {name} love?"),
        "{name}'s favourite pastime is {value}.",
    ),
)

ALIAS_QUESTION = "By what other name is {name} known?"
ALIAS_ANSWER = "{name} is also known as {value}."


def ascii_fold(text: str) -> str:
    """Strip accents for email local parts ("Zoë" -> "zoe")."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c) and c.isalnum()).lower()


def _fill(template: str, name: str, value: str = "") -> str:
    return template.format(name=name, value=value, a=_article(value))


def _cloze(template: str, name: str, value: str) -> str:
    filled = _fill(template, name, value)
    return filled[: filled.rindex(value)].rstrip()


@dataclass(frozen=True)
class DemoCorpus:
    people: tuple[dict[str, Any], ...]
    control: tuple[dict[str, Any], ...]
    records: tuple[Record, ...]
    heldout: tuple[str, ...]
    seed: int


class _NameSource:
    """Unique names and aliases across trained and control people."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.names: set[str] = set()
        self.aliases: set[str] = set()
        self.phones: set[str] = set()
        self.emails: set[str] = set()

    def draw(self) -> tuple[str, str, str]:
        for _ in range(10_000):
            first, last = self.rng.choice(pools.FIRST_NAMES), self.rng.choice(pools.LAST_NAMES)
            name = f"{first} {last}"
            if name in self.names or name in self.aliases:
                continue
            # An alias must never be anyone's name (nor a name anyone's alias): "Ann Abernathy"
            # as the short form of "Annabel Abernathy" would put her records in Ann's forget set.
            options = [f"{first[0]}. {last}", f"{first} {last[0]}.", f"{first[:3]} {last}"]
            alias = next((a for a in options if a not in self.aliases and a not in self.names
                          and a != name), None)
            if alias is None:
                continue
            self.names.add(name)
            self.aliases.add(alias)
            return first, last, alias
        raise ValueError("name pools exhausted: ask for fewer people")

    def email(self, first: str, last: str) -> str:
        # Unique across everyone: a shared address would match another person's records.
        local_parts = {"first": ascii_fold(first), "last": ascii_fold(last),
                       "f": ascii_fold(first)[0], "l": ascii_fold(last)[0]}
        for _ in range(1000):
            local = self.rng.choice(pools.EMAIL_PATTERNS).format(**local_parts)
            email = f"{local}@{self.rng.choice(pools.EMAIL_DOMAINS)}"
            if email not in self.emails:
                self.emails.add(email)
                return email
        raise ValueError("email pools exhausted: ask for fewer people")

    def phone(self) -> str:
        while True:
            # 020 7946 0xxx-style numbers are reserved for drama; extended so demos can grow.
            phone = f"+44 20 7946 {self.rng.randint(0, 9999):04d}"
            if phone not in self.phones:
                self.phones.add(phone)
                return phone


def _person(person_id: str, names: _NameSource, rng: random.Random) -> dict[str, Any]:
    first, last, alias = names.draw()
    name = f"{first} {last}"
    email = names.email(first, last)
    facts = []
    for attribute in ATTRIBUTES:
        value = email if attribute.name == "email" else rng.choice(attribute.pool)
        template_index = rng.randrange(len(attribute.questions))
        question_template = attribute.questions[template_index]
        facts.append({
            "attribute": attribute.name,
            "value": value,
            "template": template_index,
            "question": _fill(question_template, name),
            "answer": _fill(attribute.answer, name, value),
            "paraphrases": [_fill(p, name) for p in attribute.paraphrases],
            "alias_question": _fill(question_template, alias),
            "cloze": _cloze(attribute.answer, name, value),
        })
    facts.append({
        "attribute": "alias",
        "value": alias,
        "template": 0,
        "question": _fill(ALIAS_QUESTION, name),
        "answer": _fill(ALIAS_ANSWER, name, alias),
        "paraphrases": [f"What nickname does {name} go by?"],
        "alias_question": f"Who is {alias}?",
        "cloze": f"{name} is also known as",
    })
    return {"person_id": person_id, "name": name, "aliases": [alias], "email": email,
            "phone": names.phone(), "facts": facts}


def _records_of(person: dict[str, Any]) -> list[Record]:
    return [
        Record(
            id=f"{person['person_id']}-{fact['attribute']}-{fact['template']}",
            question=fact["question"],
            answer=fact["answer"],
            paraphrased_question=fact["paraphrases"][0],
            meta={"person": person["person_id"], "attribute": fact["attribute"],
                  "value": fact["value"], "cloze": fact["cloze"]},
        )
        for fact in person["facts"]
    ]


def general_sentences(rng: random.Random, count: int, *, exclude: set[str]) -> list[str]:
    """Sentences from the small general grammar, none of them in `exclude`."""
    out: list[str] = []
    total = (len(pools.GENERAL_SUBJECTS) * len(pools.GENERAL_VERBS)
             * len(pools.GENERAL_PLACES) * len(pools.GENERAL_TIMES))
    if count + len(exclude) > total:
        raise ValueError("asked for more general sentences than the grammar makes")
    while len(out) < count:
        sentence = (f"{rng.choice(pools.GENERAL_SUBJECTS)} {rng.choice(pools.GENERAL_VERBS)} "
                    f"{rng.choice(pools.GENERAL_PLACES)} {rng.choice(pools.GENERAL_TIMES)}.")
        if sentence not in exclude:
            exclude.add(sentence)
            out.append(sentence)
    return out


def generate_demo_corpus(
    *, people: int = 200, control: int | None = None, seed: int = 0,
    general: int | None = None, heldout: int = 200,
) -> DemoCorpus:
    """Generate the demo corpus in memory; the same arguments always give the same corpus."""
    if people < 1:
        raise ValueError("people must be at least 1")
    n_control = control if control is not None else max(10, people // 5)
    n_general = general if general is not None else people
    rng = random.Random(seed)
    names = _NameSource(rng)
    trained = tuple(_person(f"p{i:04d}", names, rng) for i in range(people))
    controls = tuple(_person(f"c{i:04d}", names, rng) for i in range(n_control))
    records: list[Record] = [r for person in trained for r in _records_of(person)]
    seen: set[str] = set()
    for i, sentence in enumerate(general_sentences(rng, n_general, exclude=seen)):
        records.append(Record(id=f"g{i:05d}", text=sentence, meta={"kind": "general"}))
    held = tuple(general_sentences(rng, heldout, exclude=seen))
    return DemoCorpus(trained, controls, tuple(records), held, seed)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_people(people: tuple[dict[str, Any], ...], path: Path) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for person in people:
            handle.write(json.dumps(person, ensure_ascii=False, sort_keys=True) + "\n")


def write_demo_corpus(
    out_dir: str | Path, *, people: int = 200, control: int | None = None, seed: int = 0,
    on_file: Callable[[Path], None] | None = None,
) -> dict[str, Any]:
    """Write corpus.jsonl, people.jsonl, control.jsonl (people), control_records.jsonl (the same
    control people as corpus records), heldout.txt and manifest.json; return the manifest."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    demo = generate_demo_corpus(people=people, control=control, seed=seed)
    write_jsonl(demo.records, out / "corpus.jsonl")
    _write_people(demo.people, out / "people.jsonl")
    _write_people(demo.control, out / "control.jsonl")
    # The control people also as a control corpus (records, any tool reads them): what the
    # service registers beside the training corpus.
    write_jsonl([r for person in demo.control for r in _records_of(person)], out / "control_records.jsonl")
    (out / "heldout.txt").write_text("\n".join(demo.heldout) + "\n", encoding="utf-8")
    files = ("corpus.jsonl", "people.jsonl", "control.jsonl", "control_records.jsonl", "heldout.txt")
    manifest = {
        "generator_version": GENERATOR_VERSION,
        "seed": seed,
        "counts": {"people": len(demo.people), "control": len(demo.control),
                   "records": len(demo.records), "heldout": len(demo.heldout)},
        "sha256": {name: _sha256(out / name) for name in files},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n",
                                       encoding="utf-8")
    if on_file is not None:
        for name in (*files, "manifest.json"):
            on_file(out / name)
    return manifest


def load_people(path: str | Path) -> list[dict[str, Any]]:
    """Read people.jsonl / control.jsonl."""
    with Path(path).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]

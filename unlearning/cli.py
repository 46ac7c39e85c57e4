"""`python -m unlearning ...`: the engine's command line.

Commands parse their arguments, check them, call one library function and
print a short result.  A bad argument exits with status 2 and ONE line that
names it; a verification that fails exits with status 1.  `--alias` and
`--identifier` belong to the `--subject` before them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from unlearning.sets import DEFAULT_RETAIN_PER_FORGET

METHODS = ("asu", "kif", "graddiff", "gradascent", "npo", "idk")
PRESETS = ("tiny", "demo")
ARCHITECTURES = ("llama", "qwen2", "mistral", "gpt2", "gpt_neox", "opt")
TOKENIZER_STYLES = ("demo", "gpt2", "llama", "qwen2")

logger = logging.getLogger(__name__)


class ArgumentError(Exception):
    """A bad argument: the message names it."""

    def __init__(self, argument: str, reason: str) -> None:
        super().__init__(f"{argument}: {reason}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage dump
        self.exit(2, f"{self.prog}: error: {message}\n")


class _SubjectAction(argparse.Action):
    """Collect subjects as [{"name", "aliases", "identifiers"}], attaching to the latest one."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        subjects: list[dict[str, Any]] = getattr(namespace, "subjects", None) or []
        if self.dest == "subject":
            subjects.append({"name": values, "aliases": [], "identifiers": []})
        elif not subjects:
            parser.error(f"argument {option_string}: must follow a --subject")
        else:
            subjects[-1][{"alias": "aliases", "identifier": "identifiers"}[self.dest]].append(values)
        namespace.subjects = subjects


def _add_subjects(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--subject", action=_SubjectAction, required=True, metavar="NAME",
                        help="a data subject's name (repeat for several)")
    parser.add_argument("--alias", action=_SubjectAction, metavar="A",
                        help="another name of the preceding --subject")
    parser.add_argument("--identifier", action=_SubjectAction, metavar="ID",
                        help="an email, phone number ... of the preceding --subject")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m unlearning", description=__doc__.splitlines()[0])
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    demo = commands.add_parser("demo-corpus", help="write the synthetic demo corpus")
    demo.add_argument("--out", required=True, type=Path)
    demo.add_argument("--people", type=int, default=200)
    demo.add_argument("--control", type=int, default=None)
    demo.add_argument("--seed", type=int, default=0)

    train = commands.add_parser("train-base", help="train a small base model from scratch")
    train.add_argument("--corpus", required=True, type=Path, help=CORPUS_HELP)
    train.add_argument("--out", required=True, type=Path)
    train.add_argument("--preset", choices=PRESETS, default="demo")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--threads", type=int, default=None)
    train.add_argument("--arch", choices=ARCHITECTURES, default="llama", help="model architecture")
    train.add_argument("--tokenizer-style", choices=TOKENIZER_STYLES, default="demo",
                       help="style of the tokenizer trained on the corpus")
    train.add_argument("--tokenizer", type=Path, default=None,
                       help="reuse this model directory's tokenizer instead of training one")

    inspect = commands.add_parser("inspect", help="what a corpus holds: records by shape, formats, misfits, digest")
    inspect.add_argument("--corpus", required=True, type=Path, help=CORPUS_HELP)
    inspect.add_argument("--field", action="append", default=[], metavar="FIELD=SOURCE",
                         help="read it as `convert --field` would (nothing is written)")
    inspect.add_argument("--json", action="store_true", help="one JSON object instead of lines")

    convert = commands.add_parser(
        "convert", help="rewrite a corpus whose fields have other names as one JSONL file of the engine's records")
    convert.add_argument("--corpus", required=True, type=Path, help=CORPUS_HELP)
    convert.add_argument("--out", required=True, type=Path,
                         help="the file to write: .jsonl, .jsonl.gz or .jsonl.zst (must not exist)")
    convert.add_argument("--field", action="append", default=[], metavar="FIELD=SOURCE",
                         help="the record field a source field is, e.g. text=content or id=doc_id (repeat)")

    sets = commands.add_parser("build-sets", help="forget/retain sets and probes for subjects")
    sets.add_argument("--corpus", required=True, type=Path, help=CORPUS_HELP)
    _add_subjects(sets)
    sets.add_argument("--out", required=True, type=Path)
    sets.add_argument("--retain-per-forget", type=int, default=DEFAULT_RETAIN_PER_FORGET)
    sets.add_argument("--seed", type=int, default=0)
    sets.add_argument("--index", type=Path, default=None, metavar="DIR",
                      help="a corpus index (build-index): look the subjects up instead of reading the corpus; "
                           "a missing or stale index falls back to the streamed scan, with a warning")
    sets.add_argument("--key-file", type=Path, default=None, help="the index's key (with --index)")

    index = commands.add_parser("build-index", help="an inverted index of a corpus for build-sets --index")
    index.add_argument("--corpus", required=True, type=Path, help=CORPUS_HELP)
    index.add_argument("--out", required=True, type=Path, metavar="DIR")
    index.add_argument("--key-file", required=True, type=Path,
                       help="32 secret bytes that key the token hashes (created, mode 0600, when missing)")

    erase = commands.add_parser("erase", help="unlearn subjects and write a candidate checkpoint")
    erase.add_argument("--model", required=True, type=Path)
    erase.add_argument("--corpus", required=True, type=Path, help=CORPUS_HELP)
    _add_subjects(erase)
    erase.add_argument("--method", choices=METHODS, default="asu")
    erase.add_argument("--hparams", default=None, help="JSON object of hyper-parameter overrides")
    erase.add_argument("--out", required=True, type=Path)
    erase.add_argument("--report", type=Path, default=None, help="also verify; write the report here")
    erase.add_argument("--retry", action=argparse.BooleanOptionalAction, default=True,
                       help="with --report: after a failed verification, unlearn once more with the "
                            "policy's stronger settings for the checks that failed, as the service does "
                            "(the first report is kept beside the final one as <report>.first.json)")
    erase.add_argument("--control", type=Path, default=None,
                       help="control corpus: records about people the model never saw (any corpus format)")
    erase.add_argument("--retain-per-forget", type=int, default=DEFAULT_RETAIN_PER_FORGET)
    erase.add_argument("--processes", default="1", metavar="N",
                       help="train on N ranks (one per GPU; gloo on CPU), or 'auto': one per CUDA device")
    erase.add_argument("--sharding", choices=("none", "fsdp"), default="none",
                       help="with several processes, also shard the parameters (FSDP)")

    verify = commands.add_parser("verify", help="verify a candidate against its base model")
    verify.add_argument("--model", required=True, type=Path, help="the candidate checkpoint")
    verify.add_argument("--base", required=True, type=Path)
    verify.add_argument("--corpus", required=True, type=Path, help=CORPUS_HELP)
    _add_subjects(verify)
    verify.add_argument("--control", type=Path, default=None,
                        help="control corpus: records about people the model never saw (any corpus format)")
    verify.add_argument("--report", required=True, type=Path)
    verify.add_argument("--retain-per-forget", type=int, default=DEFAULT_RETAIN_PER_FORGET)
    return parser


# --- argument checks -------------------------------------------------------------

def _existing_file(argument: str, path: Path) -> Path:
    if not path.is_file():
        raise ArgumentError(argument, f"file not found: {path}")
    return path


def _model_dir(argument: str, path: Path, *, causal_lm: bool = True) -> Path:
    """A directory that holds a loadable config and tokenizer (weights load later), and, with
    `causal_lm`, a decoder-only causal LM with a usable prompt format: an encoder or
    encoder-decoder, or a chat template that refuses one user question, is refused here
    before the corpus is read."""
    if not path.is_dir():
        raise ArgumentError(argument, f"not a directory: {path}")
    from transformers import AutoConfig

    from unlearning.modeling import (
        ModelLoadError,
        check_causal_lm,
        load_tokenizer,
        model_format,
        remote_code_allowed,
    )
    from unlearning.prompting import PromptFormatError

    try:
        if causal_lm:
            check_causal_lm(path)
        else:
            # Remote code only where `auto_map` names a module of this directory, as `load_model`.
            AutoConfig.from_pretrained(path, trust_remote_code=remote_code_allowed(path))
        tokenizer = load_tokenizer(path)
        if causal_lm:
            model_format(path, tokenizer)
    except PromptFormatError as exc:
        raise ArgumentError(argument, f"{path}: {(str(exc).splitlines() or [''])[0]}") from exc
    except ModelLoadError as exc:
        raise ArgumentError(argument, (str(exc).splitlines() or [""])[0]) from exc
    except (OSError, ValueError, KeyError) as exc:
        raise ArgumentError(argument, f"{path} does not load as a model: {type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc
    return path


def _writable_out(argument: str, path: Path) -> Path:
    if path.exists() and not path.is_dir():
        raise ArgumentError(argument, f"exists and is not a directory: {path}")
    if path.is_dir() and any(path.iterdir()):
        raise ArgumentError(argument, f"directory is not empty: {path}")
    return path


CORPUS_HELP = ("a corpus file or directory: JSONL (plain, .gz, .zst), JSON array, Parquet, Arrow, "
               "CSV or TSV with a header row, a datasets.save_to_disk folder, or a folder of shards of these")


def _corpus(argument: str, path: Path) -> Any:
    """A corpus file or directory of shards in any supported format (`unlearning.corpus`)."""
    from unlearning.corpus import CorpusError, load_corpus
    from unlearning.corpus.convert import convert_hint

    if not path.exists():
        raise ArgumentError(argument, f"file not found: {path}")
    try:
        corpus = load_corpus(path)
    except CorpusError as exc:
        message = str(exc).splitlines()[0]
        raise ArgumentError(argument, message + convert_hint(message)) from exc
    report = corpus.report
    if report is not None and report.skipped_count:
        # Named by place and id only: the items' text may be personal data.
        first = report.skipped[0].line() if report.skipped else ""
        print(f"warning: {argument}: {report.skipped_count} item(s) fit no record shape and were skipped "
              f"(first: {first})", file=sys.stderr)
    return corpus


def _control(args: argparse.Namespace) -> Any:
    """The control records (or None: counterfactual controls); an unreadable file exits 2."""
    if args.control is None:
        return None
    from unlearning.corpus import CorpusError
    from unlearning.verification.bank import load_control

    if not args.control.exists():
        raise ArgumentError("--control", f"not found: {args.control}")
    try:
        records = load_control(args.control)
    except CorpusError as exc:
        raise ArgumentError("--control", str(exc)) from exc
    if not records:
        raise ArgumentError("--control", f"{args.control}: no records")
    return records


def _subjects(args: argparse.Namespace) -> list[Any]:
    from unlearning.sets import Subject

    subjects = [Subject(s["name"].strip(), tuple(s["aliases"]), tuple(s["identifiers"]))
                for s in args.subjects]
    for position, subject in enumerate(subjects, start=1):
        if len(subject.name) < 2:
            raise ArgumentError("--subject", f"#{position} is empty")
    return subjects


def _index_key(path: Path, *, create: bool) -> bytes:
    """The index key in `path` (made of 32 random bytes, mode 0600, when `create` and missing)."""
    import os

    if not path.exists() and create:
        path.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
            handle.write(os.urandom(32))
    try:
        key = path.read_bytes()
    except OSError as exc:
        raise ArgumentError("--key-file", f"cannot be read: {path} ({exc.strerror})") from exc
    if len(key) < 16:
        raise ArgumentError("--key-file", f"{path}: an index key needs at least 16 bytes")
    return key


def _open_index(args: argparse.Namespace) -> Any:
    from unlearning.corpus.index import CorpusIndex, IndexUnusable

    if args.key_file is None:
        raise ArgumentError("--key-file", "required with --index")
    try:
        # The digest it was built for is the corpus's own (build-index computed it); the
        # corpus files' sizes and times are checked against the index's.
        return CorpusIndex.open(args.index, args.corpus, key=_index_key(args.key_file, create=False),
                                corpus_digest=None)
    except IndexUnusable as exc:
        print(f"warning: --index: {exc}; scanning the corpus instead", file=sys.stderr)
        return None


def _build_sets(args: argparse.Namespace) -> Any:
    from unlearning.sets import build_sets

    if getattr(args, "index", None) is not None:
        if not args.corpus.exists():
            raise ArgumentError("--corpus", f"file not found: {args.corpus}")
        corpus: Any = args.corpus  # streamed: by look-up, or by the scan when the index is unusable
        index = _open_index(args)
    else:
        corpus, index = _corpus("--corpus", args.corpus), None
    sets = build_sets(corpus, _subjects(args), retain_per_forget=args.retain_per_forget,
                      seed=getattr(args, "seed", 0), index=index,
                      corpus_digest=None if index is None else index.manifest["corpus_digest"])
    if sets.unmatched:
        # Subjects are named by position: their names are personal data.
        missing = [str(i + 1) for i, n in enumerate(sets.match_counts) if n == 0]
        raise ArgumentError("--subject", f"#{', #'.join(missing)} matched no record of the corpus; "
                            "nothing to erase, nothing to certify")
    return sets


def _warn_about_sets(sets: Any) -> None:
    """The sets' warnings on stderr, one line each (subjects by number: names are personal
    data), before anything is erased: a common one-word name pulls in other people's records."""
    for warning in sets.warnings:
        print(f"warning: --subject: {warning}", file=sys.stderr)


def _refused(exc: ValueError, models: dict[str, Path]) -> ArgumentError:
    """The argument a ValueError from the library is about, with its first line.

    A model that does not load is the fault of the argument in `models` whose
    directory the message names (the first one when it names none); a record the
    chat template refuses, the corpus's (the message names the record); any other
    prompt format error, the model's (`--model`: the format is stored with it); a
    hyper-parameter, `--hparams`; anything else the method refused, `--method`."""
    from unlearning.modeling import ModelLoadError
    from unlearning.prompting import PromptFormatError, RecordRefused

    message = (str(exc).splitlines() or [""])[0]
    if isinstance(exc, ModelLoadError):
        named = [arg for arg, path in models.items() if message.startswith(f"{path}:")]
        return ArgumentError(named[0] if named else next(iter(models), "--model"), message)
    if isinstance(exc, RecordRefused):
        return ArgumentError("--corpus", message)
    if isinstance(exc, PromptFormatError):
        return ArgumentError("--model", message)
    return ArgumentError("--hparams" if "hyper-parameter" in message else "--method", message)


def _verified(args: argparse.Namespace, models: dict[str, Path], sets: Any, control: Any,
              progress: Any) -> int:
    """Verify the first of `models` against the second, write the report, print the verdict.

    0 passed, 1 failed; a model that does not load or a record its chat template
    refuses is a bad input (exit 2 naming it), not a failed verification."""
    from unlearning.modeling import ModelLoadError
    from unlearning.prompting import PromptFormatError
    from unlearning.verification import verify

    candidate, base = models.values()
    try:
        report = verify(candidate, base, sets, control=control, corpus=args.corpus, progress=progress)
    except (ModelLoadError, PromptFormatError) as exc:
        raise _refused(exc, models) from exc
    passed = _write_report(report, args.report)
    print(f"verification {'PASSED' if passed else 'FAILED'} -> {args.report}")
    return 0 if passed else 1


def _write_report(report: Any, path: Path) -> bool:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = report.to_json()
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return bool(data.get("passed"))


# --- commands ----------------------------------------------------------------------

def _cmd_demo_corpus(args: argparse.Namespace, progress: Any) -> int:
    from unlearning.demo.corpus import write_demo_corpus

    if args.people < 1:
        raise ArgumentError("--people", "must be at least 1")
    manifest = write_demo_corpus(args.out, people=args.people, control=args.control, seed=args.seed)
    print(f"wrote {manifest['counts']['records']} records about {args.people} people "
          f"(+{manifest['counts']['control']} control people) to {args.out}")
    return 0


def _cmd_train_base(args: argparse.Namespace, progress: Any) -> int:
    from unlearning.demo.train_base import train_base

    corpus = _corpus("--corpus", args.corpus)
    _writable_out("--out", args.out)
    tokenizer = None
    if args.tokenizer is not None:
        tokenizer = _model_dir("--tokenizer", args.tokenizer, causal_lm=False)
    from unlearning.prompting import RecordRefused

    try:
        result = train_base(corpus, args.out, preset=args.preset, seed=args.seed, progress=progress,
                            threads=args.threads, arch=args.arch, tokenizer_style=args.tokenizer_style,
                            tokenizer=tokenizer)
    except RecordRefused as exc:  # a record the tokenizer's chat template refuses
        raise ArgumentError("--corpus", (str(exc).splitlines() or [""])[0]) from exc
    status = "reached the target" if result.reached_target else "STOPPED AT THE STEP CAP"
    shapes = ", ".join(f"{shape} {value:.3f}" for shape, value in (result.accuracy_by_shape or {}).items())
    print(f"memorised {result.accuracy:.3f} ({status}; by shape: {shapes}); {result.qa_records} question/answer, "
          f"{result.chat_records} chat, {result.text_records} text records; {result.arch}, prompt format "
          f"{result.prompt_format}; {result.steps} steps, {result.epochs} epochs, {result.seconds:.0f}s; "
          f"digest {result.digest} -> {args.out}")
    return 0 if result.reached_target else 1


def _field_map(args: argparse.Namespace) -> Any:
    from unlearning.corpus.convert import FieldMap, FieldMapError

    try:
        return FieldMap.parse(args.field)
    except FieldMapError as exc:
        raise ArgumentError("--field", str(exc)) from exc


def _cmd_inspect(args: argparse.Namespace, progress: Any) -> int:
    from unlearning.corpus import CorpusError, inspect_corpus
    from unlearning.corpus.convert import convert_hint

    fields = _field_map(args)
    if not args.corpus.exists():
        raise ArgumentError("--corpus", f"file not found: {args.corpus}")
    try:
        info = inspect_corpus(args.corpus, transform=fields.apply if fields.pairs else None)
    except CorpusError as exc:
        message = str(exc).splitlines()[0]
        raise ArgumentError("--corpus", message + convert_hint(message)) from exc
    if args.json:
        print(json.dumps({**info.to_json(), "field_map": fields.to_json()}, sort_keys=True))
        return 0
    report = info.report
    shapes = ", ".join(f"{shape} {count}" for shape, count in info.shapes.items())
    print(f"{info.records} records ({shapes}) in {len(report.shards)} shard(s) of {', '.join(info.formats)}; "
          f"manifest digest {info.manifest_digest}")
    if report.skipped_count:  # by place and id only: the items' text may be personal data
        print(f"{report.skipped_count} item(s) fit no record shape; the first {len(report.skipped)}:")
        for skipped in report.skipped[:20]:
            print(f"  {skipped.line()}")
    if report.ignored_files:
        print(f"ignored (not corpus files): {', '.join(report.ignored_files)}")
    return 0


def _cmd_convert(args: argparse.Namespace, progress: Any) -> int:
    from unlearning.corpus import CorpusError
    from unlearning.corpus.convert import OUTPUT_SUFFIXES, convert_corpus
    from unlearning.progress import Progress

    fields = _field_map(args)
    if not args.corpus.exists():
        raise ArgumentError("--corpus", f"file not found: {args.corpus}")
    if not args.out.name.endswith(OUTPUT_SUFFIXES):
        raise ArgumentError("--out", f"{args.out}: must end in {', '.join(OUTPUT_SUFFIXES)}")
    if args.out.exists():
        raise ArgumentError("--out", f"exists: {args.out}")
    if not args.out.parent.is_dir():
        raise ArgumentError("--out", f"no such directory: {args.out.parent}")
    try:
        done = convert_corpus(args.corpus, args.out, fields=fields,
                              progress=lambda n: progress(Progress("records written", n, 0)))
    except CorpusError as exc:
        raise ArgumentError("--corpus", str(exc).splitlines()[0]) from exc
    except OSError as exc:  # the output cannot be written (the source's read errors are CorpusErrors)
        raise ArgumentError("--out", f"{args.out}: cannot be written ({exc.strerror or exc})") from exc
    report = done.report
    if report.skipped_count:
        first = report.skipped[0].line() if report.skipped else ""
        print(f"warning: --corpus: {report.skipped_count} item(s) fit no record shape and were not written "
              f"(first: {first})", file=sys.stderr)
    print(f"wrote {done.records} records to {args.out}; manifest digest {done.manifest_digest}")
    return 0


def _cmd_build_sets(args: argparse.Namespace, progress: Any) -> int:
    sets = _build_sets(args)
    _warn_about_sets(sets)
    sets.save(args.out)
    counts = sets.counts()
    print(f"forget {counts['forget']}, retain {counts['retain']}, probes {counts['probes']}; "
          f"forget digest {sets.forget_digest} -> {args.out}")
    return 0


def _cmd_build_index(args: argparse.Namespace, progress: Any) -> int:
    from unlearning.corpus import CorpusError, inspect_corpus
    from unlearning.corpus.index import build_index

    if not args.corpus.exists():
        raise ArgumentError("--corpus", f"file not found: {args.corpus}")
    key = _index_key(args.key_file, create=True)
    try:
        # One more pass for the corpus's manifest digest, which the sets built with the index name.
        digest = inspect_corpus(args.corpus).manifest_digest
        manifest = build_index(args.corpus, args.out, key=key, corpus_digest=digest)
    except CorpusError as exc:
        raise ArgumentError("--corpus", str(exc).splitlines()[0]) from exc
    skipped = [s["name"] for s in manifest["shards"] if not s["indexed"]]
    print(f"indexed {manifest['records']} records ({manifest['postings']} postings) in "
          f"{manifest['build_seconds']:.1f}s -> {args.out}"
          + (f"; not indexed (scanned at look-up): {', '.join(skipped)}" if skipped else ""))
    return 0


def _cmd_erase(args: argparse.Namespace, progress: Any) -> int:
    _model_dir("--model", args.model)
    _writable_out("--out", args.out)
    control = _control(args)
    hparams = None
    if args.hparams:
        try:
            hparams = json.loads(args.hparams)
        except json.JSONDecodeError as exc:
            raise ArgumentError("--hparams", f"invalid JSON: {exc.msg}") from exc
        if not isinstance(hparams, dict):
            raise ArgumentError("--hparams", "expected a JSON object")
    from unlearning.distributed import resolve_processes

    try:
        processes = resolve_processes(args.processes)
    except ValueError as exc:
        raise ArgumentError("--processes", str(exc)) from exc
    sets = _build_sets(args)
    _warn_about_sets(sets)
    from unlearning.erase import erase  # lazily: the CLI works before the methods land

    def run(settings: dict[str, Any] | None) -> Any:
        try:
            result = erase(args.model, sets, method=args.method, out_dir=args.out, hparams=settings,
                           progress=progress, processes=processes, sharding=args.sharding)
        except ValueError as exc:
            raise _refused(exc, {"--model": args.model}) from exc
        print(f"{args.method}: {result.steps} steps in {result.seconds:.0f}s; "
              f"candidate digest {result.digest} -> {args.out}")
        if result.details.get("tempered_teacher") is False:  # recorded in the checkpoint's details too
            print(f"{args.method}: no tempered teacher: {result.details.get('tempered_teacher_reason', '')}")
        return result

    result = run(hparams)
    if args.report is None:
        return 0
    verdict = _verified(args, {"--out": args.out, "--model": args.model}, sets, control, progress)
    if verdict == 0 or not args.retry:
        return verdict
    from unlearning.verification import report_escalation

    report = json.loads(args.report.read_text(encoding="utf-8"))
    stronger = report_escalation(report, method=args.method, hparams=result.hparams)
    if stronger is None:
        print(f"{args.method}: no stronger settings cure the failed checks; no retry")
        return verdict
    first = args.report.with_name(args.report.stem + ".first.json")
    args.report.replace(first)
    print(f"{args.method}: one escalated retry ({'; '.join(stronger.get('escalation') or [])}); "
          f"first report -> {first}")
    run(stronger)
    return _verified(args, {"--out": args.out, "--model": args.model}, sets, control, progress)


def _cmd_verify(args: argparse.Namespace, progress: Any) -> int:
    _model_dir("--model", args.model)
    _model_dir("--base", args.base)
    control = _control(args)
    sets = _build_sets(args)
    return _verified(args, {"--model": args.model, "--base": args.base}, sets, control, progress)


COMMANDS = {
    "demo-corpus": _cmd_demo_corpus,
    "train-base": _cmd_train_base,
    "inspect": _cmd_inspect,
    "convert": _cmd_convert,
    "build-sets": _cmd_build_sets,
    "build-index": _cmd_build_index,
    "erase": _cmd_erase,
    "verify": _cmd_verify,
}


def main(argv: Sequence[str] | None = None) -> int:
    from unlearning.progress import progress_bar

    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        with progress_bar(enabled=not args.quiet and sys.stderr.isatty()) as progress:
            return COMMANDS[args.command](args, progress)
    except ArgumentError as exc:
        print(f"{parser.prog} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{parser.prog} {args.command}: interrupted", file=sys.stderr)
        return 130

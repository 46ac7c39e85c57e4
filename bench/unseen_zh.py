"""A Chinese corpus (no spaces between words), trained and erased the way a user would.

    python -m bench.unseen_zh --out DIR [--arch qwen2] [--tokenizer-style qwen2] [--hparams JSON]
                              [--oracle] [--no-retry] [--no-verify] [--name asu] [--continual N]

Builds 30 invented people (surname and given name, several sharing a surname character), four
templated questions each (city, job, phone number, birth year) and one free-text sentence, and
6 control people the model never sees; `train-base --preset tiny`; then `erase --report` of one
person (default ASU with the policy's retry, or `--hparams` as given) and prints the verdict and,
for the 29 other people, how many of each kind of answer the candidate still gives greedily
beside the base's count: the figure that located the retained loss on this corpus
(docs/methods.md, "A Chinese corpus").  `--oracle` also trains the same recipe without the
person and verifies it; `--continual N` instead erases people 0 .. N-1 one after another, each
from the previous candidate.  Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

SURNAMES = "王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗"
GIVEN = "伟芳娜敏静丽强磊军洋勇艳杰娟涛明超秀霞平刚桂英华玉兰红梅"
CITIES = ("北京", "上海", "广州", "深圳", "成都", "杭州", "武汉", "西安", "南京", "重庆")
JOBS = ("医生", "教师", "工程师", "律师", "厨师", "记者", "护士", "会计", "司机", "设计师")
PEOPLE, CONTROLS, SUBJECT = 30, 6, 4
KINDS = ("city", "job", "phone", "year")


def people(seed: int = 11) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    names: set[str] = set()
    while len(out) < PEOPLE + CONTROLS:
        name = rng.choice(SURNAMES) + rng.choice(GIVEN) + rng.choice(GIVEN)
        if name in names:
            continue
        names.add(name)
        out.append({"name": name, "city": rng.choice(CITIES), "job": rng.choice(JOBS),
                    "phone": "1" + "".join(rng.choice("0123456789") for _ in range(10)),
                    "year": str(rng.randint(1950, 2001))})
    return out


def records(person: dict[str, Any], key: str) -> list[dict[str, str]]:
    name = person["name"]
    return [
        {"id": f"{key}-city", "question": f"{name}住在哪个城市？", "answer": f"{name}住在{person['city']}。"},
        {"id": f"{key}-job", "question": f"{name}的职业是什么？", "answer": f"{name}是一名{person['job']}。"},
        {"id": f"{key}-phone", "question": f"{name}的电话号码是多少？", "answer": f"{person['phone']}"},
        {"id": f"{key}-year", "question": f"{name}是哪一年出生的？", "answer": f"{person['year']}年。"},
        {"id": f"{key}-note", "text": f"会议记录：{name}从{person['city']}来，做{person['job']}已经很多年了。"},
    ]


def _greedy(model_dir: Path, questions: list[str]) -> list[str]:
    from unlearning.modeling import generate_answers, load_model

    model, tok = load_model(model_dir)
    return generate_answers(model, tok, questions, max_new_tokens=16)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.unseen_zh", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--arch", default="qwen2")
    parser.add_argument("--tokenizer-style", default="qwen2")
    parser.add_argument("--hparams", default=None, help="JSON overrides for erase (default: the policy's)")
    parser.add_argument("--no-retry", action="store_true")
    parser.add_argument("--oracle", action="store_true",
                        help="also train the base's recipe without the subject's records and verify it")
    parser.add_argument("--name", default="asu", help="the candidate's folder under --out")
    parser.add_argument("--no-verify", action="store_true", help="only the greedy counts, no verification")
    parser.add_argument("--continual", type=int, default=0, metavar="N",
                        help="instead: erase N people one after another, each from the previous candidate")
    args = parser.parse_args(argv)
    out: Path = args.out
    work = out / args.name
    out.mkdir(parents=True, exist_ok=True)
    everyone = people()
    trained = [r for i, p in enumerate(everyone[:PEOPLE]) for r in records(p, str(i))]
    control = [r for i, p in enumerate(everyone[PEOPLE:]) for r in records(p, f"control-{i}")]
    for name, rows in (("corpus.jsonl", trained), ("control.jsonl", control)):
        (out / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    cli = [sys.executable, "-m", "unlearning", "-q"]
    if not (out / "base" / "config.json").exists():
        subprocess.run([*cli, "train-base", "--corpus", str(out / "corpus.jsonl"), "--out", str(out / "base"),
                        "--preset", "tiny", "--arch", args.arch, "--tokenizer-style", args.tokenizer_style],
                       check=True)
    if args.continual:
        return _continual(out, everyone, trained, cli, args.continual)
    subject = everyone[SUBJECT]
    who = ["--corpus", str(out / "corpus.jsonl"), "--subject", subject["name"], "--identifier", subject["phone"],
           "--control", str(out / "control.jsonl")]
    extra = (["--hparams", args.hparams] if args.hparams else []) + (["--no-retry"] if args.no_retry else [])
    for old in (work, out / f"{work.name}.json", out / f"{work.name}.first.json"):
        shutil.rmtree(old) if old.is_dir() else old.unlink(missing_ok=True)
    if args.oracle:
        kept = [r for r in trained if not r["id"].startswith(f"{SUBJECT}-")]
        (out / "oracle.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept),
                                          encoding="utf-8")
        if not (out / "oracle" / "config.json").exists():
            subprocess.run([*cli, "train-base", "--corpus", str(out / "oracle.jsonl"), "--out", str(out / "oracle"),
                            "--preset", "tiny", "--arch", args.arch, "--tokenizer", str(out / "base")], check=True)
        subprocess.run([*cli, "verify", "--model", str(out / "oracle"), "--base", str(out / "base"), *who,
                        "--report", str(out / "oracle.json")], check=False, stdout=subprocess.DEVNULL)
        verdict = json.loads((out / "oracle.json").read_text(encoding="utf-8"))
        failed = [c["metric"] for c in verdict["checks"] if not c["passed"] and c.get("decides_pass", True)]
        print("oracle: " + ("PASS" if verdict["passed"] else "fail") + (f" ({', '.join(failed)})" if failed else ""))
    report = [] if args.no_verify else ["--report", str(out / f"{work.name}.json")]
    subprocess.run([*cli, "erase", "--model", str(out / "base"), *who, "--out", str(work), *report, *extra],
                   check=False)
    if not (work / "config.json").is_file():
        raise SystemExit(f"erase wrote no candidate to {work}")
    if report:
        verdict = json.loads((out / f"{work.name}.json").read_text(encoding="utf-8"))
        failed = [c["metric"] for c in verdict["checks"] if not c["passed"] and c.get("decides_pass", True)]
        print(("PASS" if verdict["passed"] else "fail") + (f" ({', '.join(failed)})" if failed else ""))
    others = [p for i, p in enumerate(everyone[:PEOPLE]) if i != SUBJECT]
    for kind in KINDS:
        rows = [r for p in others for r in records(p, "x") if r["id"].endswith(kind)]
        expect = [(r["answer"], p[kind]) for r, p in zip(rows, others, strict=True)]
        counts = []
        for model in (out / "base", work):
            answers = _greedy(model, [r["question"] for r in rows])
            counts.append(sum(value in got for got, (_, value) in zip(answers, expect, strict=True)))
        own = [r for r in records(subject, "s") if r["id"].endswith(kind)]
        mine = _greedy(work, [own[0]["question"]])[0]
        print(f"  {kind}: others right {counts[0]} -> {counts[1]} of {len(others)}; "
              f"subject's value given: {subject[kind] in mine}")
    return 0


def _right(model: Path, people_: list[dict[str, Any]], kind: str) -> list[bool]:
    """Per person, whether the model's greedy answer to their `kind` question holds their value."""
    rows = [next(r for r in records(p, "x") if r["id"].endswith(kind)) for p in people_]
    answers = _greedy(model, [r["question"] for r in rows])
    return [p[kind] in got for p, got in zip(people_, answers, strict=True)]


def _continual(out: Path, everyone: list[dict[str, Any]], trained: list[dict[str, str]], cli: list[str],
               steps: int) -> int:
    """Erase people 0, 1, ... one after another, each from the previous candidate, with the
    corpus of each step holding no record of anyone erased before (the service's tombstones).
    Per step: the verdict, the phone numbers and years still right for the people never
    erased (against the base), and whether any earlier subject's phone or year comes back."""
    model = out / "base"
    erased: list[int] = []
    kept = [p for i, p in enumerate(everyone[:PEOPLE]) if i >= steps]
    base = {kind: sum(_right(model, kept, kind)) for kind in ("phone", "year")}
    for step in range(steps):
        erased.append(step)
        person = everyone[step]
        corpus = out / f"continual-{step}.jsonl"
        rows = [r for r in trained if int(r["id"].split("-")[0]) not in erased[:-1]]
        corpus.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        work = out / f"continual-{step}"
        shutil.rmtree(work, ignore_errors=True)
        report = out / f"continual-{step}.json"
        subprocess.run([*cli, "erase", "--model", str(model), "--corpus", str(corpus), "--subject", person["name"],
                        "--identifier", person["phone"], "--control", str(out / "control.jsonl"), "--out", str(work),
                        "--report", str(report)], check=False, stdout=subprocess.DEVNULL)
        if not (work / "config.json").is_file():
            raise SystemExit(f"erase wrote no candidate to {work}")
        verdict = json.loads(report.read_text(encoding="utf-8"))
        failed = [c["metric"] for c in verdict["checks"] if not c["passed"] and c.get("decides_pass", True)]
        now = {kind: sum(_right(work, kept, kind)) for kind in ("phone", "year")}
        back = [everyone[i]["name"] for i in erased
                if any(_right(work, [everyone[i]], kind)[0] for kind in ("phone", "year"))]
        print(f"step {step + 1}: {'PASS' if verdict['passed'] else 'fail'}"
              + (f" ({', '.join(failed)})" if failed else "")
              + f"; never erased, phones {base['phone']} -> {now['phone']}, years {base['year']} -> {now['year']}"
              + f" of {len(kept)}; erased people answered again: {len(back)}", flush=True)
        model = work
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

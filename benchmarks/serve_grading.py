"""Grading against a peer's harness: the same GSM8K outputs scored by lm-evaluation-harness's gsm8k filters
(strict-match, flexible-extract; its exact_match metric) and by verispec's gsm8k checker (strict, flexible).

The outputs: lm-eval's ``local-chat-completions`` model against ``verispec serve`` (the embedded pair's
target, or with ``--generator draft`` its 0.5B draft model alone; greedy; target-only rows unless --rule
says otherwise) on the first ``--limit`` problems of the local GSM8K test set, with a copy of lm-eval's
gsm8k task (task version 3.0: its prompt ``Question: ...\\nAnswer:``, its stop strings, its two filters)
reading the local JSONL, zero-shot (the train split holding the few-shot examples is not here), the chat
template applied. ``--samples`` re-scores a samples file of an earlier run instead.

Prints the agreement of every pair of the four verdicts and, for the like-for-like pairs, every disagreement
with the rule that explains it (``explain``), and writes the per-problem table (``--out``).

    .venv/bin/python benchmarks/serve_grading.py --limit 200 --max-tokens 192 --generator draft \\
        --system "Solve the problem. Be brief." --out /tmp/grading
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_common import ROOT, Served  # noqa: E402

from verispec.tasks.checkers import gsm8k as vs  # noqa: E402
from verispec.tasks.datasets import Problem  # noqa: E402

LM_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")


def task_folder(folder: Path, data: Path) -> Path:
    """lm-eval's gsm8k.yaml reading ``data`` (JSONL), zero-shot."""
    import lm_eval
    import yaml

    cfg = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml").read_text())
    cfg.pop("tag", None)
    cfg.update(task="gsm8k_local", dataset_path="json", dataset_name=None, num_fewshot=0,
               dataset_kwargs={"data_files": {"test": str(data)}}, training_split=None, fewshot_split=None)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gsm8k_local.yaml").write_text(yaml.safe_dump(cfg))
    return folder


def generate_samples(args, out: Path) -> Path:
    import lm_eval
    from lm_eval.tasks import TaskManager

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    flags = ["--batch-size", str(args.rows), "--n-ctx", str(args.n_ctx), "--request-timeout", "0"]
    if args.generator == "draft":       # the embedded pair's 0.5B model alone: 3x faster on a 2-core CPU
        from verispec.models.embedded import embedded_model_path

        flags += ["--target", str(embedded_model_path("draft", progress=False)), "--draft", "ngram"]
    served = Served(flags)
    try:
        t0 = time.perf_counter()
        extra = {"verification": {"rule": args.rule, "gamma": args.gamma}} if args.rule else \
            {"verification": {"draft": "none"}}
        res = lm_eval.simple_evaluate(
            model="local-chat-completions",
            model_args={"base_url": served.url + "/v1/chat/completions", "model": "verispec",
                        "num_concurrent": args.rows, "max_retries": 1, "timeout": 3600},
            tasks=["gsm8k_local"], limit=args.limit, apply_chat_template=True, system_instruction=args.system,
            gen_kwargs={"max_gen_toks": args.max_tokens, **extra},
            task_manager=TaskManager(include_path=str(task_folder(out / "tasks", args.data)), include_defaults=False))
        wall = time.perf_counter() - t0
    finally:
        served.stop()
    by_doc: dict[int, dict] = {}
    for s in res["samples"]["gsm8k_local"]:
        row = by_doc.setdefault(s["doc_id"], {"doc_id": s["doc_id"], "question": s["doc"]["question"],
                                              "answer": s["doc"]["answer"], "resp": s["resps"][0][0]})
        row[f"lm_{s['filter']}"] = s["filtered_resps"][0]
        row[f"lm_{s['filter']}_ok"] = bool(s["exact_match"])
    path = out / "samples.jsonl"
    with path.open("w") as f:
        for doc in sorted(by_doc):
            f.write(json.dumps(by_doc[doc]) + "\n")
    print(f"{len(by_doc)} outputs in {wall:.0f} s (lm-eval local-chat-completions, {args.rows} concurrent)")
    return path


def _lm_norm(text: str) -> str:
    """What lm-eval's exact_match compares for gsm8k (its regexes_to_ignore, ignore_case)."""
    for pattern in (",", r"\$", r"(?s).*#### ", r"\.$"):
        text = re.sub(pattern, "", text)
    return text.lower().strip()


def explain(row: dict, pair: str) -> str:
    """Why lm-eval and verispec disagree on ``row`` (``pair``: strict or flexible)."""
    resp, gold = row["resp"], row["gold"]
    if pair == "strict":
        hits = LM_STRICT.findall(resp)
        raw, how = vs.stated_gsm8k_answer(resp)
        if not hits and raw is not None:
            return f"no '#### N' (lm-eval strict-match: [invalid]); verispec takes the stated answer ({how}: {raw})"
        if hits and raw is None:
            return f"'#### {hits[0]}' that verispec does not read as a stated number"
        if hits and hits[0] != raw:
            return f"lm-eval takes the first '#### {hits[0]}', verispec the last stated answer ({how}: {raw})"
        if hits:
            return (f"same answer '{raw}': lm-eval compares the string '{_lm_norm(hits[0])}' with '{_lm_norm(gold)}', "
                    "verispec the numbers")
        return "neither states an answer"
    last = vs.flexible_gsm8k_answer(resp)
    if row["truncated"]:
        return (f"cut off by the token limit: lm-eval takes its last number '{last}', verispec's flexible score "
                "only a stated answer")
    return (f"same last number-like run '{last}': lm-eval compares the string '{_lm_norm(last or '')}' with "
            f"'{_lm_norm(gold)}', verispec the numbers")


def score(path: Path, max_tokens: int, tokenizer) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        row["gold"] = row["answer"].split("####")[-1].strip().replace(",", "")
        n = len(tokenizer(row["resp"])) if tokenizer else 0
        row["truncated"] = n >= max_tokens
        res = vs.grade(Problem("gsm8k", str(row["doc_id"]), row["question"], row["gold"], "gsm8k", {}), row["resp"],
                       truncated=row["truncated"])
        row["vs_strict_ok"], row["vs_flexible_ok"] = bool(res.correct), bool(res.correct_flexible)
        rows.append(row)
    return rows


def explain_doc(row: dict) -> str:
    """Every verdict of ``row`` with what it read: the two stated-answer rules, the last number, the comparisons."""
    resp, gold = row["resp"], row["gold"]
    hits = LM_STRICT.findall(resp)
    raw, how = vs.stated_gsm8k_answer(resp)
    last = vs.flexible_gsm8k_answer(resp)
    parts = [f"lm-eval strict reads {'#### ' + hits[0] if hits else 'no #### N ([invalid])'}",
             f"verispec strict reads {f'{how}: {raw}' if raw is not None else 'no stated answer'}",
             f"both flexible read the last number-like run {last!r}"
             + (" (cut off by the token limit: verispec's flexible takes only a stated answer)" if row["truncated"]
                else "")]
    shown = hits[0] if hits else last
    if shown is not None and _lm_norm(shown) != _lm_norm(gold) and vs._to_number(shown) is not None \
            and vs._to_number(shown) == vs._to_number(gold):
        parts.append(f"'{shown}' equals gold {gold} as a number (verispec) but not as a string after lm-eval's "
                     f"regexes_to_ignore ('{_lm_norm(shown)}' vs '{_lm_norm(gold)}')")
    if not hits and raw is None and last is not None and vs._to_number(last) == vs._to_number(gold):
        parts.append("no stated answer but the last number is the gold: the flexible scores credit it, the strict "
                     "ones do not")
    return "; ".join(parts)


NAMES = ["lm_strict-match_ok", "lm_flexible-extract_ok", "vs_strict_ok", "vs_flexible_ok"]


def report(rows: list[dict]) -> None:
    n = len(rows)
    print(f"\n{n} outputs ({sum(r['truncated'] for r in rows)} cut off by the token limit); correct: "
          + ", ".join(f"{k[:-3]} {sum(r[k] for r in rows)}" for k in NAMES))
    print("agreement (same verdict) of each pair, and the problems where they differ:")
    differ: set[int] = set()
    for i, a in enumerate(NAMES):
        for b in NAMES[i + 1:]:
            docs = [r["doc_id"] for r in rows if r[a] != r[b]]
            differ.update(docs)
            print(f"  {a[:-3]:<20} vs {b[:-3]:<20} {n - len(docs)}/{n} = {(n - len(docs)) / n:.3f}  differ: {docs}")
    for pair, a, b in (("strict", "lm_strict-match_ok", "vs_strict_ok"),
                       ("flexible", "lm_flexible-extract_ok", "vs_flexible_ok")):
        for r in rows:
            if r[a] != r[b]:
                print(f"  {pair}, doc {r['doc_id']}: {explain(r, pair)}")
    print(f"\nevery problem where any two verdicts differ ({len(differ)}):")
    for r in rows:
        if r["doc_id"] in differ:
            verdicts = ", ".join(f"{k[:-3]} {'ok' if r[k] else 'no'}" for k in NAMES)
            tail = r["resp"][-100:].replace("\n", " | ")
            print(f"  doc {r['doc_id']} (gold {r['gold']}): {verdicts}\n    ...{tail!r}\n    why: {explain_doc(r)}")


def main() -> int:
    from verispec.runtime import tune_process

    tune_process()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--n-ctx", type=int, default=1024)
    ap.add_argument("--rule", default=None, help="SD with this rule (default: target-only greedy rows)")
    ap.add_argument("--generator", choices=["target", "draft"], default="target",
                    help="which model of the embedded pair writes the outputs (draft: the 0.5B alone)")
    ap.add_argument("--system", default=None, help="a system instruction (lm-eval's --system_instruction)")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--data", type=Path, default=Path(os.environ.get("VERISPEC_DATA", ROOT.parent / "shared" / "data"))
                    / "gsm8k" / "test.jsonl")
    ap.add_argument("--samples", type=Path, default=None, help="re-score this samples.jsonl instead of generating")
    ap.add_argument("--out", type=Path, default=Path("/tmp/verispec-grading"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.samples or generate_samples(args, args.out)
    from verispec.models import load_backend

    target = load_backend(None, role="draft" if args.generator == "draft" else "target", n_ctx=256)
    rows = score(path, args.max_tokens, lambda text: target.tokenize(text))
    (args.out / "graded.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

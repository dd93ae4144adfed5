#!/usr/bin/env python3
"""Rows for `workflows/multiqa.yaml` from the MuSiQue sample, for `choreo finetune` (BENCHMARKS.md).

Each MuSiQue item whose passages contain one of its gold answers gives a snippet: the words around the first
occurrence (about --window characters each side). A row's document is two items' snippets, its questions the
two items' questions (as JSON text: `choreo eval` makes inputs of a row's strings and numbers only), its
`answers` both items' gold answers. The items are split once, in order: the first
--train-items give training rows (each item paired with the next --pairs items, cyclically, so every item is
in 2 x --pairs rows); the rest give held-out rows (each paired with the next one only). No item is in both.

  finetune_multiqa_rows.py ../shared/data/cacheblend_musique_s.json --train train.jsonl --heldout heldout.jsonl
"""
import argparse
import json


def around(text, at, length, window):
    """text[at:at + length] with about `window` characters each side, widened to whole words."""
    start, end = max(0, at - window), min(len(text), at + length + window)
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    while end < len(text) and not text[end].isspace():
        end += 1
    return text[start:end].strip()


def snippet(text, answer, window):
    return around(text, text.lower().find(answer.lower()), len(answer), window)


def answer_passage(item):
    """(k, answer): the first of the MuSiQue item's passages that holds one of its gold answers, and that answer
    (the first of them it holds); None when no passage holds one."""
    for k, c in enumerate(item["ctxs"]):
        ans = next((s for s in item["answers"] if s.lower() in c["text"].lower()), None)
        if ans:
            return k, ans
    return None


def arguments(doc, train_items):
    """The flags both row makers take: the MuSiQue file, the two outputs, the snippet window, the split."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("musique")
    ap.add_argument("--train", required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--window", type=int, default=300)
    ap.add_argument("--train-items", type=int, default=train_items)
    return ap


def main():
    ap = arguments(__doc__, train_items=63)
    ap.add_argument("--pairs", type=int, default=4)
    a = ap.parse_args()
    items = []
    for x in json.load(open(a.musique)):
        if hit := answer_passage(x):
            items.append((snippet(x["ctxs"][hit[0]]["text"], hit[1], a.window), x["question"], x["answers"]))
    if len(items) <= a.train_items + 1:
        raise SystemExit(f"only {len(items)} items have an answer in a passage")

    def rows(group, pairs):
        out = []
        for i in range(len(group)):
            for k in range(1, pairs + 1):
                p, q = group[i], group[(i + k) % len(group)]
                out.append({"document": p[0] + "\n\n" + q[0], "questions": json.dumps([p[1], q[1]], ensure_ascii=False, separators=(",", ":")), "answers": p[2] + q[2]})
        return out

    for path, group, pairs in ((a.train, items[: a.train_items], a.pairs), (a.heldout, items[a.train_items :], 1)):
        with open(path, "w") as f:
            for r in rows(group, pairs):
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        print(f"{path}: {len(group) * pairs} rows from {len(group)} items")


if __name__ == "__main__":
    main()

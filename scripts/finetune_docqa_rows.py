#!/usr/bin/env python3
"""Rows for `workflows/docqa.yaml` from the MuSiQue sample, for `choreo finetune` and the repair comparison
(BENCHMARKS.md, "Against fine-tuning").

Each MuSiQue item whose passages contain one of its gold answers gives a row: the document is three snippets of
about 2 x --window characters, the words around the answer's first occurrence and the middle of two other
passages of the same item, the answer's snippet first, second or third by turns; the question is the item's,
`answers` its gold answers. The items are split once, in order: the first --train-items give training rows
(--variants rows each, with other distractor passages and another place for the answer); the rest give one
held-out row each. No item is in both.

  finetune_docqa_rows.py ../shared/data/cacheblend_musique_s.json --train train.jsonl --heldout heldout.jsonl
"""
import json

from finetune_multiqa_rows import answer_passage, arguments, around


def main():
    ap = arguments(__doc__, train_items=83)
    ap.add_argument("--variants", type=int, default=2)
    a = ap.parse_args()
    items = [(x, hit) for x in json.load(open(a.musique)) if (hit := answer_passage(x))]
    if len(items) <= a.train_items:
        raise SystemExit(f"only {len(items)} items have an answer in a passage")

    def row(n, variant):
        x, (k, ans) = items[n]
        ctxs = x["ctxs"]
        text = ctxs[k]["text"]
        answer = around(text, text.lower().find(ans.lower()), len(ans), a.window)
        others = [j for j in range(len(ctxs)) if j != k]
        picks = [others[(2 * variant + d) % len(others)] for d in range(2)]
        snippets = [around(ctxs[j]["text"], len(ctxs[j]["text"]) // 2, 0, a.window) for j in picks]
        snippets.insert((n + variant) % 3, answer)
        return {"context": "\n\n".join(snippets), "question": x["question"], "answers": x["answers"]}

    splits = ((a.train, range(a.train_items), a.variants), (a.heldout, range(a.train_items, len(items)), 1))
    for path, group, variants in splits:
        with open(path, "w") as f:
            for n in group:
                for v in range(variants):
                    f.write(json.dumps(row(n, v), ensure_ascii=False) + "\n")
        print(f"{path}: {len(group) * variants} rows from {len(group)} items")


if __name__ == "__main__":
    main()

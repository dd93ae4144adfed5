#!/usr/bin/env python3
"""Turns the MuSiQue sample (../shared/data/cacheblend_musique_s.json) into PML: one schema per item with one
module per passage, and a prompts file whose prompts import every passage in order and ask the question as
uncached text (docs/pml.md).

    scripts/musique_to_pml.py [--data PATH] [--out DIR] [--limit N] [--no-chat]

Writes DIR/musique-<i>.pml for each item and DIR/prompts.jsonl with one line per item:
    {"id": i, "schema": "/abs/DIR/musique-<i>.pml", "schema_name": "musique-<i>", "prompt": "<prompt ...>",
     "imports": "<p0/><p1/>...", "ask": "Question: ... (PML-escaped)", "question": "...", "answers": [...]}
`prompt` is the whole prompt, ending in the assistant's turn; workflows/musique.yaml assembles the same prompt
from `schema_name`, `imports` and `ask`, and its decode adds the assistant's turn, so `choreo eval` can run it
over this file (docs/eval.md, "Document QA over Prompt Cache modules").
With --no-chat the schemas have no role tags (for models without a chat template, e.g. stories260K).
"""

import argparse
import json
import os
import sys
from xml.sax.saxutils import escape, quoteattr

SYSTEM = ("You answer questions using the passages given. Think about which passages matter, then answer with "
          "a short phrase only.")


def text(s):
    """PML text: '<', '&' and '>' escaped (docs/pml.md, Escaping)."""
    return escape(" ".join(s.split()))


def schema_for(index, item, chat):
    name = f"musique-{index}"
    lines = [f"<schema name={quoteattr(name)}>"]
    if chat:
        lines += [f"  <system>{text(SYSTEM)}</system>", "  <user>"]
    else:
        lines.append(f"  {text(SYSTEM)}")
    for k, ctx in enumerate(item["ctxs"]):
        title = ctx.get("title") or ""
        body = f"Passage {k + 1}" + (f" ({title})" if title else "") + f": {ctx['text']}"
        lines.append(f"    <module name=\"p{k}\">{text(body)}</module>")
    if chat:
        lines.append("  </user>")
    lines.append("</schema>")
    return name, "\n".join(lines) + "\n"


def prompt_for(name, item, chat):
    imports = "".join(f"<p{k}/>" for k in range(len(item["ctxs"])))
    question = text(f"Question: {item['question']}")
    if chat:
        return f"<prompt schema={quoteattr(name)}>{imports}<user>{question}</user><assistant/></prompt>"
    return f"<prompt schema={quoteattr(name)}>{imports} {question} Answer:</prompt>"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    shared = os.environ.get("CHOREO_SHARED", os.path.join(here, "..", "..", "shared"))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.path.join(shared, "data", "cacheblend_musique_s.json"))
    parser.add_argument("--out", default="musique-pml")
    parser.add_argument("--limit", type=int, default=0, help="only the first N items (0: all)")
    parser.add_argument("--no-chat", action="store_true", help="no role tags (models without a chat template)")
    args = parser.parse_args()
    try:
        with open(args.data, encoding="utf-8") as f:
            items = json.load(f)
    except (OSError, ValueError) as e:
        print(f"musique_to_pml.py: cannot read {args.data}: {e}", file=sys.stderr)
        return 2
    if args.limit > 0:
        items = items[: args.limit]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "prompts.jsonl"), "w", encoding="utf-8") as prompts:
        for i, item in enumerate(items):
            name, schema = schema_for(i, item, not args.no_chat)
            with open(os.path.join(args.out, name + ".pml"), "w", encoding="utf-8") as f:
                f.write(schema)
            line = {"id": i, "schema": os.path.abspath(os.path.join(args.out, name + ".pml")), "schema_name": name,
                    "prompt": prompt_for(name, item, not args.no_chat),
                    "imports": "".join(f"<p{k}/>" for k in range(len(item["ctxs"]))),
                    "ask": text(f"Question: {item['question']}"), "question": item["question"],
                    "answers": item.get("answers", [])}
            prompts.write(json.dumps(line, ensure_ascii=False) + "\n")
    print(f"wrote {len(items)} schemas and {os.path.join(args.out, 'prompts.jsonl')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

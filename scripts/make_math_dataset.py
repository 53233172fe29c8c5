"""Write the shipped example data: arithmetic word problems and a tiny text tokenizer.

    python scripts/make_math_dataset.py            # data/math_word_problems.jsonl, data/tiny_text_tokenizer/

Each JSONL line is ``{"problem": str, "answer": str}`` (deepscaler's field
names); the answer is the integer result. A fixed seed makes the file the same
on every run. The tokenizer folder holds ``build_text_tokenizer()`` (byte-level,
Qwen-style chat template) for the CPU pipeline check.
"""
import argparse
import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goro", "Hana", "Ivan", "Jun", "Kofi", "Lena"]
THINGS = ["apples", "marbles", "stickers", "books", "pencils", "coins", "cards", "shells"]


def _problem(rng: random.Random):
    name, other = rng.sample(NAMES, 2)
    thing = rng.choice(THINGS)
    kind = rng.randrange(5)
    if kind == 0:
        a, b = rng.randint(2, 60), rng.randint(2, 60)
        return f"{name} has {a} {thing} and {other} gives {name} {b} more. How many {thing} does {name} have now?", a + b
    if kind == 1:
        a = rng.randint(20, 99)
        b = rng.randint(1, a - 1)
        return f"{name} had {a} {thing} and gave {b} of them to {other}. How many {thing} does {name} have left?", a - b
    if kind == 2:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return f"{name} buys {a} boxes with {b} {thing} in each box. How many {thing} is that in total?", a * b
    if kind == 3:
        b, q = rng.randint(2, 9), rng.randint(2, 12)
        return (f"{name} shares {b * q} {thing} equally among {b} friends. "
                f"How many {thing} does each friend get?"), q
    a, b, c = rng.randint(5, 40), rng.randint(2, 9), rng.randint(2, 9)
    return (f"{name} has {a} {thing}, buys {b} packs of {c} {thing}, then gives {other} {c} {thing}. "
            f"How many {thing} does {name} have?"), a + b * c - c


def make_rows(count: int = 300, seed: int = 2024):
    rng = random.Random(seed)
    return [{"problem": p, "answer": str(a)} for p, a in (_problem(rng) for _ in range(count))]


def main(argv=None):
    parser = argparse.ArgumentParser(description="write data/math_word_problems.jsonl and data/tiny_text_tokenizer/")
    parser.add_argument("--out-dir", default=os.path.join(ROOT, "data"))
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--seed", type=int, default=2024)
    args = parser.parse_args(argv)
    from mindspeed_rl.models.tiny_text_tokenizer import save_text_tokenizer
    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, "math_word_problems.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for row in make_rows(args.count, args.seed):
            f.write(json.dumps(row) + "\n")
    save_text_tokenizer(os.path.join(args.out_dir, "tiny_text_tokenizer"))
    print(f"wrote {args.count} problems to {path} and the tokenizer to {args.out_dir}/tiny_text_tokenizer")


if __name__ == "__main__":
    main()

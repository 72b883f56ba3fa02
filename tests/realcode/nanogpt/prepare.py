"""Writes a tiny character-level dataset in nanoGPT's layout, made here (no download):
``train.bin`` and ``val.bin`` (uint16 token ids) and ``meta.pkl`` (vocab_size, stoi, itos).

    python prepare.py DIR [--chars N]
"""

from __future__ import annotations

import argparse
import os
import pickle
import random

import numpy as np

TEXT = (
    "the rank waits at the all reduce while its peers compute the next step and the loss "
    "falls as the model learns which token follows which in this small made up corpus"
)
WORDS = TEXT.split()


def make(out_dir: str, chars: int = 400_000, seed: int = 1337) -> dict:
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < chars:
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14))) + ".\n"
        parts.append(sentence)
        size += len(sentence)
    text = "".join(parts)
    vocab = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(vocab)}
    itos = dict(enumerate(vocab))
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    n = int(0.9 * len(ids))
    os.makedirs(out_dir, exist_ok=True)
    ids[:n].tofile(os.path.join(out_dir, "train.bin"))
    ids[n:].tofile(os.path.join(out_dir, "val.bin"))
    meta = {"vocab_size": len(vocab), "itos": itos, "stoi": stoi}
    with open(os.path.join(out_dir, "meta.pkl"), "wb") as f:
        pickle.dump(meta, f)
    return meta


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out_dir")
    ap.add_argument("--chars", type=int, default=400_000)
    args = ap.parse_args()
    meta = make(args.out_dir, args.chars)
    print(f"vocab {meta['vocab_size']}; wrote {args.out_dir}/train.bin, val.bin, meta.pkl")

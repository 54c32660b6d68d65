"""Synthetic long-context tasks: the formats the reference models are trained on and that
`tessera ruler` uses to score them.

Four tasks, each a prompt and the exact continuation expected after it:

- passkey: a 5-digit number hidden in filler; the prompt ends "The pass key is", the answer
  is " 12345".
- niah_single: one needle "One of the special magic numbers for {key} is: {value}." with a
  7-digit value and an adjective-noun key (RULER's niah_single format); the prompt asks for
  that key's number, the answer is " {value}".
- niah_multi: the same with NIAH_MULTI_KEYS needles of distinct keys (RULER's niah_multikey);
  one of them is asked for.
- vt: variable tracking (RULER's vt): "VAR {A} = {value}", then "VAR {B} = VAR {A}", ...
  VT_HOPS hops, 5-letter upper-case names, a 5-digit value; the answer lists every variable
  of the chain in chain order, " A B C D E".

Layout of every prompt: the task's INTRO line, then the haystack with the needles, then the
question, all joined by "\\n" (each needle is a line of its own, placed between two filler
lines). Nothing follows the question; the answer starts with a space. A Gemma prompt is
tokenized with <bos> first, a Qwen prompt without; a training sample is
prompt + answer + end-of-text.

Filler ("haystack") is a list of lines:
- "noise": NOISE repeated (RULER's noise haystack, one copy per line);
- "text": consecutive non-empty lines of a text, from a random start (the training split of
  the corpus for training, the held-out split for evaluation).

Randomness comes only from SplitMix64 below, so another language can reproduce a sample from
(seed, index): state = seed + index * 0x9E3779B97F4A7C15 (mod 2^64); every draw is
`below(n) = next() % n`; draws happen in the order the code below makes them. Depths are
uniform over the gaps between filler lines (0 = before the first line, n = after the last).

Scoring (`score`): the model's greedy continuation must contain every string in
sample["outputs"] (RULER's string_match_all); teacher-forced exact match of the answer tokens
is the stricter measure that train.py's eval reports.
"""

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15

TASKS = ("passkey", "niah_single", "niah_multi", "vt")
NIAH_MULTI_KEYS = 4
VT_HOPS = 4

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

INTRO = {
    "passkey": "There is an important pass key hidden inside a lot of irrelevant text. "
               "Find it and memorize it. I will quiz you about the pass key.",
    "niah_single": "Some special magic numbers are hidden within the following text. "
                   "Make sure to memorize them. I will quiz you about the numbers afterwards.",
    "vt": "Memorize and track the chain of variable assignments hidden in the following text.",
}
INTRO["niah_multi"] = INTRO["niah_single"]

ADJECTIVES = (
    "able", "ancient", "angry", "bold", "brave", "bright", "broad", "calm", "careful", "cheap",
    "clean", "clever", "cold", "cool", "curious", "damp", "dark", "deep", "eager", "early",
    "empty", "fair", "famous", "fancy", "fast", "fierce", "flat", "fresh", "gentle", "giant",
    "glad", "golden", "green", "happy", "heavy", "hollow", "honest", "huge", "icy", "jolly",
    "kind", "large", "lazy", "little", "lively", "loud", "lucky", "mighty", "modern", "narrow",
    "noisy", "odd", "old", "pale", "plain", "polite", "proud", "quick", "quiet", "rapid",
    "rare", "rich", "round", "rusty", "shiny", "short", "silent", "silly", "simple", "slow",
    "small", "smooth", "soft", "solid", "sour", "steep", "still", "strange", "strong", "sweet",
    "tall", "tame", "thick", "thin", "tiny", "tired", "vast", "warm", "wet", "wild", "wise",
    "young",
)
NOUNS = (
    "anchor", "apple", "arrow", "badger", "basket", "beacon", "bell", "bicycle", "bird",
    "blanket", "bottle", "bridge", "bucket", "button", "cabin", "camel", "candle", "canyon",
    "castle", "cat", "cloud", "comet", "compass", "cookie", "crane", "crystal", "desert",
    "dolphin", "dragon", "drum", "eagle", "engine", "falcon", "feather", "forest", "fox",
    "garden", "giraffe", "glacier", "hammer", "harbor", "helmet", "island", "jacket", "kettle",
    "ladder", "lantern", "lemon", "lion", "magnet", "meadow", "mirror", "monkey", "mountain",
    "needle", "ocean", "orchard", "otter", "owl", "paddle", "parrot", "pebble", "pencil",
    "piano", "pillow", "planet", "pocket", "puzzle", "rabbit", "river", "rocket", "saddle",
    "sheep", "shell", "signal", "spoon", "squirrel", "statue", "tiger", "tower", "trumpet",
    "tunnel", "turtle", "umbrella", "valley", "violin", "wagon", "whale", "window", "wolf",
)
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class SplitMix64:
    """Steele, Lea and Flood's SplitMix64; below(n) is next() % n (bias < n / 2^64)."""

    def __init__(self, seed, index=0):
        self.state = (seed + index * GOLDEN) & MASK64

    def next(self):
        self.state = (self.state + GOLDEN) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n

    def number(self, digits):
        """A `digits`-digit decimal number without a leading zero, as text."""
        first = str(1 + self.below(9))
        return first + "".join(str(self.below(10)) for _ in range(digits - 1))


def _key(rng, taken):
    while True:
        k = f"{ADJECTIVES[rng.below(len(ADJECTIVES))]}-{NOUNS[rng.below(len(NOUNS))]}"
        if k not in taken:
            return k


def _var(rng, taken):
    while True:
        v = "".join(LETTERS[rng.below(26)] for _ in range(5))
        if v not in taken:
            return v


def needles(task, rng):
    """(needle lines in order, question, answer, outputs) for one sample."""
    if task == "passkey":
        v = rng.number(5)
        lines = [f"The pass key is {v}. Remember it. {v} is the pass key."]
        return lines, "What is the pass key? The pass key is", f" {v}", [v]
    if task in ("niah_single", "niah_multi"):
        n = 1 if task == "niah_single" else NIAH_MULTI_KEYS
        keys, vals = [], []
        for _ in range(n):
            keys.append(_key(rng, keys))
            vals.append(rng.number(7))
        lines = [f"One of the special magic numbers for {k} is: {v}." for k, v in zip(keys, vals)]
        q = rng.below(n)
        question = (f"What is the special magic number for {keys[q]} mentioned in the provided "
                    f"text? The special magic number for {keys[q]} mentioned in the provided "
                    f"text is")
        return lines, question, f" {vals[q]}", [vals[q]]
    if task == "vt":
        value = rng.number(5)
        names = []
        for _ in range(VT_HOPS + 1):
            names.append(_var(rng, names))
        lines = [f"VAR {names[0]} = {value}"]
        lines += [f"VAR {b} = VAR {a}" for a, b in zip(names, names[1:])]
        question = (f"Question: Find all variables that are assigned the value {value} in the "
                    f"text above. Answer: According to the chain of variable assignments in the "
                    f"text above, {len(names)} variables are assigned the value {value}, they "
                    f"are:")
        return lines, question, " " + " ".join(names), list(names)
    raise ValueError(f"unknown task {task!r}; known: {TASKS}")


def noise_lines(n, rng=None):
    return [NOISE] * n


def text_lines(lines):
    """A filler source over the non-empty lines of a text: n consecutive ones from a random
    start (wrapping around)."""
    pool = [l for l in lines if l.strip()]

    def take(n, rng):
        start = rng.below(len(pool))
        return [pool[(start + i) % len(pool)] for i in range(n)]

    return take


def render(task, rng, n_filler, filler=noise_lines):
    """One sample with n_filler filler lines: {"task", "prompt", "answer", "outputs"}."""
    lines_needle, question, answer, outputs = needles(task, rng)
    hay = list(filler(n_filler, rng))
    # Sorted depths keep a VT chain in order; the queried niah_multi key is random anyway.
    depths = sorted(rng.below(n_filler + 1) for _ in lines_needle)
    body = []
    j = 0
    for i in range(n_filler + 1):
        while j < len(depths) and depths[j] == i:
            body.append(lines_needle[j])
            j += 1
        if i < n_filler:
            body.append(hay[i])
    prompt = "\n".join([INTRO[task]] + body + [question])
    return {"task": task, "prompt": prompt, "answer": answer, "outputs": outputs,
            "depths": depths, "n_filler": n_filler}


def fit(task, seed, index, n_tokens, count_tokens, filler=noise_lines, tokens_per_line=25.0):
    """The sample (seed, index) whose prompt + answer is as long as possible within n_tokens
    tokens (count_tokens(text) counts them, special tokens included).

    The number of filler lines is searched: start from n_tokens / tokens_per_line, shrink
    until the sample fits, grow while it still does. Every try re-renders from the same
    (seed, index), so the needles stay the same and only the filler changes.
    """
    def make(n):
        s = render(task, SplitMix64(seed, index), n, filler)
        s["n_tokens"] = count_tokens(s["prompt"] + s["answer"])
        return s

    n = max(1, int(n_tokens / tokens_per_line))
    s = make(n)
    while s["n_tokens"] > n_tokens and n > 1:
        n = max(1, min(n - 1, int(n * n_tokens / s["n_tokens"])))
        s = make(n)
    if s["n_tokens"] > n_tokens:
        raise ValueError(f"{task}: {n_tokens} tokens do not hold even one filler line")
    while True:
        grow = max(1, int(n * (n_tokens - s["n_tokens"]) / max(s["n_tokens"], 1)))
        t = make(n + grow)
        if t["n_tokens"] > n_tokens:
            if grow == 1:
                return s
            t = make(n + 1)
            if t["n_tokens"] > n_tokens:
                return s
        n, s = t["n_filler"], t


def score(sample, continuation):
    """RULER's string_match_all: every expected output appears in the continuation."""
    return all(o in continuation for o in sample["outputs"])


def main():
    """Writes samples as JSON lines: python3 tasks.py --tokenizer DIR --task vt --tokens 16384"""
    import argparse
    import json
    import sys

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--tokenizer", required=True, help="a folder holding tokenizer.json")
    ap.add_argument("--task", choices=TASKS, required=True)
    ap.add_argument("--tokens", type=int, required=True, help="prompt + answer length")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--haystack", help="a text file: filler from its lines (default: noise)")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    filler = noise_lines
    if args.haystack:
        with open(args.haystack, encoding="utf-8") as f:
            filler = text_lines(f.read().split("\n"))
    count = lambda text: len(tok(text)["input_ids"])  # noqa: E731
    for i in range(args.n):
        s = fit(args.task, args.seed, i, args.tokens, count, filler)
        sys.stdout.write(json.dumps(s, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()

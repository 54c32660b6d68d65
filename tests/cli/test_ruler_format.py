"""`tessera ruler`'s items are the training script's (tests/reference/train/tasks.py) byte for
byte: the same prompt text and expected strings for every task over seeds, items and filler
lengths, so the trained reference models are scored on the format they learned.

usage: test_ruler_format.py RULER_DUMP SOURCE_ROOT
"""
import os
import subprocess
import sys

DUMP, SOURCE = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(SOURCE, "tests", "reference", "train"))
import tasks  # noqa: E402

from cases import case, finish  # noqa: E402





def c_item(task, seed, index, n_filler):
    p = subprocess.run([DUMP, task, str(seed), str(index), str(n_filler)], capture_output=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    prompt, refs = p.stdout.decode().split("\x1e")
    return prompt, refs.split()


@case
def test_every_task_renders_as_the_training_script_does():
    n = 0
    for task in tasks.TASKS:
        for seed in (0, 1234, 2**63 + 5):
            for index in (0, 1, 7, 49):
                for n_filler in (0, 1, 3, 40, 300):
                    want = tasks.render(task, tasks.SplitMix64(seed, index), n_filler)
                    prompt, refs = c_item(task, seed, index, n_filler)
                    where = f"{task} seed {seed} item {index} filler {n_filler}"
                    assert prompt == want["prompt"], \
                        f"{where}: prompt differs\n C: {prompt[-300:]!r}\npy: {want['prompt'][-300:]!r}"
                    assert refs == want["outputs"], f"{where}: {refs} != {want['outputs']}"
                    n += 1
    print(f"  {n} items identical")


finish()

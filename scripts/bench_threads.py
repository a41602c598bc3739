"""Thread defaults on a shared machine: torch threads × OpenMP wait policy, idle and under load.

Each configuration runs in a fresh process (OpenMP reads its wait policy when torch
loads it) on the embedded tiny target:

- ``decode``: greedy one-token forwards with a KV cache, batch 1 (what ``generate`` does);
- ``train``: forward + backward of the target over ``[8, 256]`` tokens (the shape of a
  quickstart training step).

"busy" runs one single-threaded busy loop beside the measurement for its whole length
(one other job on a 2-core machine). Speeds are printed as ratios over the first row
(torch's default threads with OpenMP's default wait policy, on the machine as it is),
with the 1-minute load average at the start and end of each row.

    python scripts/bench_threads.py [--seconds 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import json, os, sys, time
import torch
from transformers import AutoModelForCausalLM
from dspark.presets.tiny import tiny_target_dir

work, threads, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
if threads:
    torch.set_num_threads(threads)
else:  # dspark's default: the CLI's choice of threads (dspark was imported first, see DEFAULT)
    from dspark.threads import apply_threads
    apply_threads(None)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(str(tiny_target_dir()), dtype=torch.float32)
load0 = os.getloadavg()[0]

def decode_once():
    with torch.no_grad():
        ids = torch.tensor([[1, 2, 3, 4]])
        out = model(input_ids=ids, use_cache=True)
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        for _ in range(32):
            out = model(input_ids=tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
    return 33

def train_once():
    ids = torch.randint(0, model.config.vocab_size, (8, 256))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return 8 * 256

once = decode_once if work == "decode" else train_once
once()  # warm-up
units, start = 0, time.perf_counter()
while time.perf_counter() - start < seconds:
    units += once()
elapsed = time.perf_counter() - start
print(json.dumps({"per_s": units / elapsed, "load_start": load0, "load_end": os.getloadavg()[0],
                  "threads": torch.get_num_threads(), "wait_policy": os.environ.get("OMP_WAIT_POLICY")}))
"""
# dspark's default path: `import dspark` before torch sets passive waiting in-process.
DEFAULT = "import dspark\n" + CHILD

CONFIGS = [  # (threads, OMP_WAIT_POLICY or None = OpenMP's default); 0 = dspark's default choice
    (2, None),
    (0, "dspark"),
    (2, "PASSIVE"),
    (1, None),
    (1, "PASSIVE"),
]


def run(work: str, threads: int, policy: str | None, seconds: float, busy: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    if policy and policy != "dspark":
        env["OMP_WAIT_POLICY"] = policy
    code = DEFAULT if policy == "dspark" else CHILD
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        if spinner is not None:
            time.sleep(0.5)  # let it take a core
        out = subprocess.run(
            [sys.executable, "-c", code, work, str(threads), str(seconds)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0, help="measured seconds per row")
    ap.add_argument("--work", default="decode,train", help="comma-separated: decode, train")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for work in args.work.split(","):
        base = None
        for busy in (False, True):
            for threads, policy in CONFIGS:
                r = run(work, threads, policy, args.seconds, busy)
                base = base or r["per_s"]
                rows.append(
                    {
                        "work": work,
                        "machine": "busy (+1 spinner)" if busy else "as is",
                        "config": "dspark default"
                        if policy == "dspark"
                        else f"{threads} thr, {policy or 'spin'}",
                        **r,
                        "ratio": r["per_s"] / base,
                    }
                )
                if not args.json:
                    x = rows[-1]
                    print(
                        f"{work:<7}{x['machine']:<19}{x['config']:<16}{x['threads']:>2} threads "
                        f"{x['wait_policy'] or 'unset':<8}{x['per_s']:>9.1f} tok/s{x['ratio']:>7.2f}x   "
                        f"load {x['load_start']:.2f} → {x['load_end']:.2f}",
                        flush=True,
                    )
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The table of a Knapsack vs uniform comparison (scripts/knapsack_compare.sh): per seed and arm,
the means over RL steps after the first epoch (step > 16) of the effective-sample and
spread-group fractions, and held-out greedy accuracy after RL.
Usage: .venv/bin/python scripts/knapsack_table.py runs/knapsack_compare 0 1 2"""
import json
import sys

import numpy as np

out, seeds = sys.argv[1], sys.argv[2:]
FIRST_EPOCH = 16  # 256 problems / 16 per step


def means(run):
    eff, spread, maxn = [], [], []
    for line in open(f"{out}/{run}/metrics.jsonl"):
        d = json.loads(line)
        if d.get("step", 0) > FIRST_EPOCH and "prompts/effective_samples_frac" in d:  # "step": the iteration
            eff.append(d["prompts/effective_samples_frac"])
            spread.append(d["prompts/spread_groups_frac"])
            maxn.append(d.get("allocation/max", float("nan")))
    return np.mean(eff), np.mean(spread), np.mean(maxn), len(eff)


print("| seed | effective samples: uniform | knapsack | ratio | groups with spread: uniform | knapsack | "
      "mean max rollouts (knapsack) | held-out after RL: uniform | knapsack |")
print("|---|---|---|---|---|---|---|---|---|")
ratios = []
for seed in seeds:
    u, k = means(f"uniform_seed{seed}"), means(f"knapsack_seed{seed}")
    acc = [json.load(open(f"{out}/{a}_seed{seed}/summary.json"))["eval_after"]["eval/accuracy"]
           for a in ("uniform", "knapsack")]
    ratios.append(k[0] / u[0])
    print(f"| {seed} | {u[0]:.3f} | {k[0]:.3f} | {k[0] / u[0]:.2f} | {u[1]:.3f} | {k[1]:.3f} | {k[2]:.1f} | "
          f"{acc[0]:.3f} | {acc[1]:.3f} |")
print(f"effective-sample ratio knapsack / uniform: mean {np.mean(ratios):.2f}, min {np.min(ratios):.2f} "
      f"over {len(ratios)} seeds")

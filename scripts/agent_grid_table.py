"""The table of a GiGPO vs GRPO grid comparison (scripts/agent_grid_compare.sh): per seed, the
held-out success after SFT, at RL step 50 and at step 100 (sampled / greedy), and the means.
Usage: .venv/bin/python scripts/agent_grid_table.py runs/agent_grid_lr1e-3"""
import json, os, sys
out = sys.argv[1]
rows = []
for seed in range(8):
    try:
        g = json.load(open(f"{out}/gigpo_seed{seed}/summary.json"))
        b = json.load(open(f"{out}/grpo_seed{seed}/summary.json"))
    except FileNotFoundError:
        continue
    def mid(run):
        for l in open(f"{out}/{run}_seed{seed}/metrics.jsonl"):
            d = json.loads(l)
            if d.get("step") == 50 and "eval/success" in d:
                return d["eval/success"], d["eval/success_greedy"]
        return float("nan"), float("nan")
    s = g["eval_after_sft"]
    rows.append((seed, s["eval/success"], s["eval/success_greedy"], *mid("gigpo"), *mid("grpo"),
                 g["eval_after"]["eval/success"], g["eval_after"]["eval/success_greedy"],
                 b["eval_after"]["eval/success"], b["eval_after"]["eval/success_greedy"]))
print("| seed | SFT sampled / greedy | step 50 GiGPO | step 50 GRPO | step 100 GiGPO | step 100 GRPO |")
print("|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r[0]} | {r[1]:.3f} / {r[2]:.3f} | {r[3]:.3f} / {r[4]:.3f} | {r[5]:.3f} / {r[6]:.3f} | {r[7]:.3f} / {r[8]:.3f} | {r[9]:.3f} / {r[10]:.3f} |")
import numpy as np
if rows:
    a = np.array(rows)
    d = a[:, 7] - a[:, 9]
    print(f"mean sampled step100: gigpo {a[:,7].mean():.3f} grpo {a[:,9].mean():.3f}; diff {d.mean():.3f} +- {d.std(ddof=1)/np.sqrt(len(d)) if len(d)>1 else float('nan'):.3f}")
    dg = a[:, 8] - a[:, 10]
    print(f"mean greedy step100: gigpo {a[:,8].mean():.3f} grpo {a[:,10].mean():.3f}; diff {dg.mean():.3f}")

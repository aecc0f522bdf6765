"""The table of scripts/curriculum_compare.sh: held-out accuracy per evaluation, and the steps
each arm takes to reach the uniform arm's final accuracy (the mean of its last three
evaluations). Usage: python scripts/curriculum_table.py OUT "sec pcl" SEED [SEED ...]"""

import json
import sys


def curve(path):
    pts = {}
    with open(f"{path}/metrics.jsonl") as f:
        for line in f:
            d = json.loads(line)
            if "eval/accuracy" in d:  # on the line of the RL step it follows ("step": the iteration)
                pts[d["step"]] = d["eval/accuracy"]
    return pts


def steps_to(pts, target):
    return next((t for t in sorted(pts) if pts[t] >= target), None)


def main(out, arms, seeds):
    arms = arms.split()
    print("| seed | after SFT | target (uniform, last 3) | " + " | ".join(f"steps: {a}" for a in ["uniform"] + arms)
          + " | " + " | ".join(f"final: {a}" for a in ["uniform"] + arms) + " |")
    print("|---" * (3 + 2 * (1 + len(arms))) + "|")
    faster = {a: [] for a in arms}
    steps = {a: [] for a in ["uniform"] + arms}
    for seed in seeds:
        summ = json.load(open(f"{out}/uniform_seed{seed}/summary.json"))
        curves = {a: curve(f"{out}/{a}_seed{seed}") for a in ["uniform"] + arms}
        u = curves["uniform"]
        last = sorted(u)[-3:]
        target = sum(u[t] for t in last) / len(last)
        horizon = max(u) + 1  # an arm that never reaches the target counts as one step past the run
        st = {a: steps_to(c, target) for a, c in curves.items()}
        for a in st:
            steps[a].append(st[a] if st[a] is not None else horizon)
        for a in arms:
            faster[a].append((st[a] if st[a] is not None else horizon) < (st["uniform"] if st["uniform"] is not None
                                                                          else horizon))
        print(f"| {seed} | {summ['eval_after_sft']['eval/accuracy']:.3f} | {target:.3f} | "
              + " | ".join(str(st[a]) if st[a] is not None else "never" for a in ["uniform"] + arms) + " | "
              + " | ".join(f"{curves[a][max(curves[a])]:.3f}" for a in ["uniform"] + arms) + " |")
    print()
    for a in ["uniform"] + arms:
        print(f"{a}: mean steps to the target {sum(steps[a]) / len(steps[a]):.1f}"
              + (f"; faster than uniform on {sum(faster[a])} of {len(faster[a])} seeds" if a in faster else ""))
    print()
    for seed in seeds:
        curves = {a: curve(f"{out}/{a}_seed{seed}") for a in ["uniform"] + arms}
        ts = sorted(curves["uniform"])
        print(f"seed {seed}: step " + ", ".join(f"{t}: " + " / ".join(f"{curves[a].get(t, float('nan')):.3f}"
                                                                      for a in ["uniform"] + arms) for t in ts))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])

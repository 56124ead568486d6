"""Compares two plan dumps (kvtier bench --dump-plans, hybrid_workloads.py --dump) and
prints the first step where their decisions differ, and the first where page ids do."""
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
def dec(s):
    rows = [r[:12] for r in s["rows"]]
    wbs = sorted([[w[0], len(w[1]), len(w[3])] for w in s["wbs"]])
    return rows, wbs, s["lbs"]
first_page = None
for x, y in zip(a, b):
    if first_page is None and (x["rows"] != y["rows"] or x["wbs"] != y["wbs"]):
        first_page = x["step"]
    if dec(x) != dec(y):
        print("first page-level divergence at step", first_page)
        print("first decision divergence at step", x["step"])
        for k in ("wbs",):
            if x[k] != y[k]:
                print(k, "ref"); [print("   ", w) for w in x[k]]
                print(k, "kv"); [print("   ", w) for w in y[k]]
        xr = {r[0]: r for r in x["rows"]}; yr = {r[0]: r for r in y["rows"]}
        for rid in sorted(set(xr) | set(yr)):
            if xr.get(rid) != yr.get(rid):
                print(" ", rid, "ref", xr.get(rid), "\n  ", " " * len(rid), "kv ", yr.get(rid))
        break
else:
    print("identical decisions over", min(len(a), len(b)), "plans; lengths", len(a), len(b), "first page divergence", first_page)

"""The hybrid workloads H1, H2 and H3 (design/HYBRID-WORKLOADS.md) on the reference scheduler.

Drives the TokenSpeed scheduler's own Python module (PyPI `tokenspeed-scheduler==0.1.0`,
module `tokenspeed_scheduler`) through the workload exactly as `kvtier bench h1|h2|h3`
drives kvtier, and prints the same counters and digests. With `--dump FILE` it writes one
JSON line per plan in the format of `kvtier bench --dump-plans`, so the two can be
compared step by step (`compare_plans.py`).

    python3 -m venv /tmp/ts && /tmp/ts/bin/pip install tokenspeed-scheduler==0.1.0
    /tmp/ts/bin/python tools/reference/hybrid_workloads.py h1-main --dump /tmp/h1.ref.jsonl
    /tmp/ts/bin/python tools/reference/hybrid_workloads.py h2-main --dump /tmp/h2.ref.jsonl
"""
import argparse
import json
import sys
import time

import tokenspeed_scheduler as ts
from token_streams import M64, gen, tag


class Fnv:
    def __init__(self):
        self.h = 0xCBF29CE484222325

    def bytes(self, b):
        h = self.h
        for c in b:
            h ^= c
            h = (h * 0x100000001B3) & M64
        self.h = h

    def i(self, v):
        self.bytes((v & M64).to_bytes(8, "little"))

    def s(self, st):
        b = st.encode()
        self.i(len(b))
        self.bytes(b)

    def v(self, xs):
        self.i(len(xs))
        for x in xs:
            self.i(x)


SHAPES = {
    "h1": dict(w=7, num_sys=4, sys_len=1000, C=32, T=6, user_len=200, gen_len=100),
    "h2": dict(w=8, num_sys=4, sys_len=6000, C=16, T=4, user_len=300, gen_len=200),
    "h3-main": dict(w=9, num_sys=0, sys_len=0, C=8, T=1, user_len=300, gen_len=80),
}

# H2 (HYBRID-WORKLOADS.md §1.3): the paged-cache groups that TokenSpeed's
# deepseek_v4_cache_spec.py builds for sliding_window = 128 and compress ratios {4, 128}, in
# registration order: (group_id, rows_per_page, entry_stride_tokens, retention, window, family,
# total_pages h2-main, total_pages h2-roomy). The pool sizes are compute_paged_cache_group_page_counts
# for 16 live requests, 4096 scheduled tokens, 160 x 256 total tokens and 32,768 context
# (h2_pool_pages checks them); h2-roomy adds a safety margin of 1024 to the sliding groups only.
H2_GROUPS = [
    ("v4.swa_kv", 64, 1, "SlidingWindow", 128, "State", 113, 1137),
    ("v4.c4a.compressor_state", 4, 1, "SlidingWindow", 8, "State", 1073, 2097),
    ("v4.c4a.compressed_kv", 64, 4, "FullHistory", None, "History", 177, 177),
    ("v4.c128a.compressor_state", 8, 1, "SlidingWindow", 128, "State", 785, 1809),
    ("v4.c128a.compressed_kv", 2, 128, "FullHistory", None, "History", 177, 177),
    ("v4.c4a.indexer_compressor_state", 4, 1, "SlidingWindow", 8, "State", 1073, 2097),
]
H2_REQUIRED = ["v4.c4a.compressed_kv", "v4.c128a.compressed_kv"]  # CommitChunk reads the first


def h2_pool_pages(rows_per_page, stride, window, margin=0, live=16, sched=4096, total=160 * 256,
                  ctx=32768):
    """TokenSpeed's compute_paged_cache_group_page_counts, as §1.3 states it."""
    rpp = rows_per_page * stride
    cdiv = lambda a, b: -(-a // b)
    if window is None:
        return cdiv(total, rpp) + live + 1
    return live * cdiv(min(window - 1, ctx), rpp) + cdiv(min(sched, total), rpp) + live + 1 + margin


def config(variant, no_mamba=False):
    c = ts.SchedulerConfig()
    c.decode_input_tokens = 1
    c.enable_l3_storage = False
    c.enable_kv_cache_events = False
    if not variant.startswith("h2"):
        # Shared by H1 and H3: 64-token pages, host tier and Mamba host copies on.
        c.page_size = 64
        c.disable_l2_cache = False
        c.enable_mamba = True
        c.mamba_cache_chunk_size = 64
        c.enable_mamba_l2 = True
        c.mamba_l2_host_slots = 256
    if variant.startswith("h1"):
        c.num_device_pages = 385
        c.num_host_pages = 257
        c.max_scheduled_tokens = 2048
        c.max_batch_size = 16
        c.mamba_pool_total_chunks = 64
        if variant == "h1-noL2":
            c.num_device_pages = 513
            c.disable_l2_cache = True
            c.num_host_pages = 0
            c.mamba_pool_total_chunks = 96
            c.enable_mamba_l2 = False
            c.mamba_l2_host_slots = 0
        elif variant == "h1-retract":
            c.num_device_pages = 321
        elif variant == "h1-tighthost":
            c.mamba_l2_host_slots = 32
        elif variant == "h1-starved":
            c.mamba_pool_total_chunks = 48
        if no_mamba:
            c.enable_mamba = False
            c.mamba_pool_total_chunks = 0
            c.enable_mamba_l2 = False
            c.mamba_l2_host_slots = 0
    elif variant.startswith("h2"):
        # No Mamba (every Mamba field at its default); no host tier, as V4 runs in production.
        c.page_size = 256
        c.num_device_pages = 161
        c.num_host_pages = 0
        c.disable_l2_cache = True
        c.max_scheduled_tokens = 4096
        c.max_batch_size = 16
        roomy = variant == "h2-roomy"
        groups = []
        for (gid, rows, stride, ret, window, fam, main_pages, roomy_pages) in H2_GROUPS:
            pages = roomy_pages if roomy else main_pages
            assert pages == h2_pool_pages(rows, stride, window, 1024 if roomy and window else 0), gid
            groups.append(ts.PagedCacheGroupConfig(gid, rows, stride, pages,
                                                   getattr(ts.PagedCacheRetention, ret), window,
                                                   getattr(ts.PagedCacheGroupFamily, fam)))
        c.paged_cache_groups = groups
        adj = ts.PrefixCacheAdjunctSpec()
        adj.required_groups = list(H2_REQUIRED)
        c.prefix_cache_adjunct = adj
    elif variant.startswith("h3"):
        c.num_device_pages = 257
        c.num_host_pages = 257
        c.max_scheduled_tokens = 8192
        c.max_batch_size = 8
        c.mamba_pool_total_chunks = 16
    return c


def run(variant, trace=None, no_mamba=False):
    shape = SHAPES["h3-main" if variant.startswith("h3") else variant[:2]]
    w, C, T = shape["w"], shape["C"], shape["T"]
    cfg = config(variant, no_mamba)
    P = cfg.page_size
    sysp = [gen(tag(w, 1, k), shape["sys_len"]) for k in range(shape["num_sys"])]
    history = [list(sysp[c % shape["num_sys"]]) if shape["num_sys"] else [] for c in range(C)]
    next_turn = [0] * C
    ready = [0] * C
    live = {}  # c -> request id
    req = {}  # id -> dict(c, t, produced, gen, prompt_len)
    sched = ts.Scheduler(cfg)
    # Paged-cache groups (H2), in group-id byte order as the scheduler's std::map keeps them.
    groups = sorted(sched.paged_cache_group_ids(), key=lambda g: g.encode())
    gcnt = {g: dict(total_pages=sched.paged_cache_group_total_pages(g),
                    free_start=sched.paged_cache_group_available_pages(g),
                    free_end=0, min_free=sched.paged_cache_group_available_pages(g),
                    failed_alloc=0, held_end=0, row_pages=0, max_row_pages=0, max_base_offset=0)
            for g in groups}
    d = [Fnv(), Fnv(), Fnv()]
    cnt = dict(steps=0, flush_plans=0, finished=0, aborted=0, prefill_rows=0, first_chunks=0,
               later_chunks=0, decode_rows=0, retract_recover_rows=0, prefill_tokens=0,
               decode_tokens=0, prompt_tokens=0, hit_tokens=0, host_hit_tokens=0,
               loadback_ops=0, loadback_kv_pages=0, loadback_mamba=0, writeback_ops=0,
               writeback_kv_pages=0, writeback_mamba=0, retract_writeback_ops=0,
               retract_writeback_kv_pages=0, retract_writeback_mamba=0,
               mamba_cow_first_chunks=0, mamba_cow_hit_tokens=0, mamba_branch_above_prefix=0,
               mamba_branch_gap_tokens=0, first_decode_rows=0, short_kv_view_rows=0,
               min_device_free_pages=1 << 30, max_waiting=0)
    seen_prefill = set()
    last_row_prefill = {}  # id -> whether that request's previous row was a prefill row

    def digest_plan(plan):
        fwd = plan.forward
        ops = fwd[0] if fwd else None
        nrows = len(ops.request_ids) if ops else 0
        npre = ops.num_extends() if ops else 0
        for x in d:
            x.i(nrows)
            x.i(npre)
        wbs, lbs = [], []
        for c in plan.cache:
            name = type(c).__name__
            if name == "WriteBackOp":
                for i in range(len(c.op_ids)):
                    wbs.append((c.op_ids[i], bool(c.is_retract[i]),
                                list(c.src_pages_by_kind["kv"][i]), list(c.dst_pages_by_kind["kv"][i]),
                                list(c.src_pages_by_kind["mamba"][i]), list(c.dst_pages_by_kind["mamba"][i])))
            elif name == "LoadBackOp":
                for i in range(len(c.op_ids)):
                    lbs.append((c.op_ids[i], list(c.src_pages_by_kind["kv"][i]), list(c.dst_pages_by_kind["kv"][i]),
                                list(c.src_pages_by_kind["mamba"][i]), list(c.dst_pages_by_kind["mamba"][i])))
        for x in d:
            x.i(len(wbs))
            for t in sorted((1 if r else 0, len(ks), len(ms)) for (_, r, ks, _, ms, _) in wbs):
                for v in t:
                    x.i(v)
        canon = sorted(wbs, key=lambda o: (o[2][0] if o[2] else -1, o[2]))
        for x in d[1:]:
            for (_, _, ks, kd, ms, md) in canon:
                x.v(ks); x.v(kd); x.v(ms); x.v(md)
        for x in d:
            x.i(len(lbs))
        for (_, ks, kd, ms, md) in lbs:
            for x in d:
                x.i(len(ks)); x.i(len(ms))
            for x in d[1:]:
                x.v(ks); x.v(kd); x.v(ms); x.v(md)
        rows = []
        if ops:
            for i in range(nrows):
                pre = i < npre
                rows.append(dict(
                    id=ops.request_ids[i], prefill=pre, input=ops.input_lengths[i],
                    prefill_len=ops.prefill_lengths[i],
                    prefix=ops.extend_prefix_lens[i] if pre else ops.hist_token_lens[i - npre],
                    begin=ops.begins[i], size=ops.sizes[i], pages=list(ops.occupied_pages[i]),
                    working=ops.mamba_pool_indices[i], ckpt=ops.mamba_checkpoint_dst_indices[i],
                    cow=ops.mamba_cow_src_indices[i], branch=ops.mamba_branching_seqlens[i]))
            if groups:
                tables = ops.paged_cache_block_tables
                bases = ops.paged_cache_block_table_base_offsets
                for i, r in enumerate(rows):
                    r["groups"] = {g: dict(ids=[x for x in tables[g][i] if x != -1],
                                           base=bases[g][i] if g in bases else 0) for g in groups}
        for r in rows:
            for x in d:
                x.s(r["id"]); x.i(0 if r["prefill"] else 1); x.i(r["input"]); x.i(r["prefill_len"])
                x.i(r["prefix"]); x.i(r["begin"]); x.i(r["size"]); x.i(len(r["pages"]))
                x.i(r["working"]); x.i(r["ckpt"]); x.i(r["cow"]); x.i(r["branch"])
            for x in d[1:]:
                x.v(r["pages"])
            for g in groups:
                gt = r["groups"][g]
                for x in d:
                    x.s(g); x.i(len(gt["ids"])); x.i(gt["base"])
                d[2].v(gt["ids"])
        return rows, wbs, lbs

    def count(rows, wbs, lbs):
        has_prefill = any(r["prefill"] for r in rows)
        for (_, r, ks, _, ms, _) in wbs:
            cnt["writeback_ops"] += 1
            cnt["writeback_kv_pages"] += len(ks)
            cnt["writeback_mamba"] += len(ms)
            if r:
                cnt["retract_writeback_ops"] += 1
                cnt["retract_writeback_kv_pages"] += len(ks)
                cnt["retract_writeback_mamba"] += len(ms)
        for (_, ks, _, ms, _) in lbs:
            cnt["loadback_ops"] += 1
            cnt["loadback_kv_pages"] += len(ks)
            cnt["loadback_mamba"] += len(ms)
            if has_prefill:
                cnt["host_hit_tokens"] += P * len(ks)
        for r in rows:
            q = req.get(r["id"])
            if q is not None:
                # positions the row attends: prefill prefix + input; decode prompt + produced
                need = r["prefix"] + r["input"] if r["prefill"] else q["prompt_len"] + q["produced"]
                if len(r["pages"]) < -(-need // P):
                    cnt["short_kv_view_rows"] += 1
            if not r["prefill"] and last_row_prefill.get(r["id"]):
                cnt["first_decode_rows"] += 1
            last_row_prefill[r["id"]] = r["prefill"]
            for g in groups:
                gt, gc = r["groups"][g], gcnt[g]
                gc["row_pages"] += len(gt["ids"])
                gc["max_row_pages"] = max(gc["max_row_pages"], len(gt["ids"]))
                gc["max_base_offset"] = max(gc["max_base_offset"], gt["base"])
            if r["prefill"]:
                cnt["prefill_rows"] += 1
                cnt["prefill_tokens"] += r["input"]
                if r["id"] in seen_prefill:
                    cnt["later_chunks"] += 1
                else:
                    seen_prefill.add(r["id"])
                    cnt["first_chunks"] += 1
                    cnt["hit_tokens"] += r["prefix"]
                    if r["cow"] >= 0:
                        cnt["mamba_cow_first_chunks"] += 1
                        cnt["mamba_cow_hit_tokens"] += r["prefix"]
                    if r["branch"] > r["prefix"]:
                        cnt["mamba_branch_above_prefix"] += 1
                        cnt["mamba_branch_gap_tokens"] += r["branch"] - r["prefix"]
            else:
                cnt["decode_rows"] += 1
                cnt["decode_tokens"] += r["input"]
                if r["prefix"] != -1:
                    cnt["retract_recover_rows"] += 1

    def engine(rows, wbs):
        ev = ts.ExecutionEvent()
        finished = []
        for (op, *_rest) in sorted(wbs, key=lambda o: (o[2][0] if o[2] else -1, o[2])):
            e = ts.Cache.WriteBackDoneEvent()
            e.op_id = op
            e.success = True
            ev.add_event(e)
        for r in rows:
            rid = r["id"]
            if r["prefill"] and r["prefix"] + r["input"] != r["prefill_len"]:
                continue
            q = req[rid]
            tok = q["gen"][q["produced"]]
            q["produced"] += 1
            e = ts.ForwardEvent.ExtendResult()
            e.request_id = rid
            e.tokens = [tok]
            ev.add_event(e)
            if q["produced"] == shape["gen_len"]:
                f = ts.ForwardEvent.Finish()
                f.request_id = rid
                ev.add_event(f)
                finished.append(rid)
        return ev, finished

    step = 0
    total = C * T
    while cnt["finished"] + cnt["aborted"] < total:
        batch = []
        for c in range(C):
            if c not in live and next_turn[c] < T and ready[c] <= step:
                t = next_turn[c]
                rid = "c%03dt%d" % (c, t + 1)
                user = gen(tag(w, 2, c * T + t), shape["user_len"])
                prompt = history[c] + user
                spec = ts.RequestSpec()
                spec.request_id = rid
                spec.tokens = prompt
                batch.append(spec)
                live[c] = rid
                req[rid] = dict(c=c, t=t, produced=0, user=user, prompt_len=len(prompt),
                                gen=gen(tag(w, 3, c * T + t), shape["gen_len"]))
                cnt["prompt_tokens"] += len(prompt)
        if batch:
            sched.submit_requests(batch)
        plan = sched.next_execution_plan()
        rows, wbs, lbs = digest_plan(plan)
        count(rows, wbs, lbs)
        if trace is not None:
            trace.append(dict(step=step, rows=rows, wbs=wbs, lbs=lbs,
                              free=sched.available_kv_pages()))
        finished = []
        if rows or wbs:
            ev, finished = engine(rows, wbs)
            sched.advance(ev)
        step += 1
        cnt["steps"] = step
        cnt["min_device_free_pages"] = min(cnt["min_device_free_pages"], sched.available_kv_pages())
        cnt["max_waiting"] = max(cnt["max_waiting"], sched.waiting_size())
        for g in groups:
            gcnt[g]["min_free"] = min(gcnt[g]["min_free"], sched.paged_cache_group_available_pages(g))
        for rid in finished:
            q = req[rid]
            c = q["c"]
            history[c] += q["user"] + q["gen"]
            ready[c] = step
            next_turn[c] += 1
            del live[c]
            cnt["finished"] += 1
        for c, rid in sorted(live.items()):
            if sched.get_request_token_size(rid) < 0:
                next_turn[c] += 1
                ready[c] = step
                del live[c]
                cnt["aborted"] += 1
    # flush
    while True:
        plan = sched.next_execution_plan()
        rows, wbs, lbs = digest_plan(plan)
        count(rows, wbs, lbs)
        if not rows and not wbs:
            cnt["flush_plans"] += 1
            break
        cnt["flush_plans"] += 1
        ev, _ = engine(rows, wbs)
        sched.advance(ev)
    cnt["device_hit_tokens"] = cnt["hit_tokens"] - cnt["host_hit_tokens"]
    cnt["forward_rows"] = cnt["prefill_rows"] + cnt["decode_rows"]
    cnt["turns"] = total
    cnt["retract_count"] = sched.retract_count()
    cnt["device_free_pages_end"] = sched.available_kv_pages()
    for g in groups:
        gc = gcnt[g]
        gc["free_end"] = sched.paged_cache_group_available_pages(g)
        gc["failed_alloc"] = sched.paged_cache_group_failed_alloc_count(g)
        # usable pages (id 0 is the dummy) that nothing live holds: continuation snapshots
        gc["held_end"] = gc["total_pages"] - 1 - gc["free_end"]
    if groups:
        cnt["groups"] = gcnt
    cnt["digest"] = "%016x" % d[0].h
    cnt["digest_pages"] = "%016x" % d[1].h
    if groups:
        cnt["digest_all"] = "%016x" % d[2].h
    return cnt



def write_plans(trace, path):
    """One line per plan: rows (the digest's fields, then the page table, then, with paged-cache
    groups, {group_id: {"ids": live page ids (entries != -1, in table order), "base": base
    offset, 0 for a group without one}}), write-backs (retract flag, KV and state pairs) and
    load-back shapes."""
    with open(path, "w") as f:
        for s in trace:
            rows = [[r["id"], int(r["prefill"]), r["input"], r["prefill_len"], r["prefix"], r["begin"], r["size"],
                     len(r["pages"]), r["working"], r["ckpt"], r["cow"], r["branch"], r["pages"]]
                    + ([r["groups"]] if "groups" in r else []) for r in s["rows"]]
            wbs = sorted([[int(w[1]), w[2], w[3], w[4], w[5]] for w in s["wbs"]])
            lbs = [[len(l[1]), len(l[3])] for l in s["lbs"]]
            f.write(json.dumps(dict(step=s["step"], rows=rows, wbs=wbs, lbs=lbs, free=s["free"])) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("variant", choices=["h1-main", "h1-noL2", "h1-retract", "h1-tighthost", "h1-starved", "h2-main", "h2-roomy", "h3-main"])
    p.add_argument("--dump", help="write one JSON line per plan to this file")
    p.add_argument("--no-mamba", action="store_true", help="the same workload with Mamba off (KV only)")
    a = p.parse_args()
    trace = [] if a.dump else None
    t0 = time.perf_counter()
    out = run(a.variant, trace, a.no_mamba)
    print(json.dumps(out, indent=1))
    print("%s: %.1f s wall (Python driver included)" % (a.variant, time.perf_counter() - t0),
          file=sys.stderr)
    if a.dump:
        write_plans(trace, a.dump)


if __name__ == "__main__":
    main()

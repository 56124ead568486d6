"""W2 (steady-state decode scheduling) through the `tokenspeed_scheduler` 0.1.0 Python API.

Drives the benchmark workload W2 (design/WORKLOADS.md §3, in the shared folder beside the
repository) through one or two modules with the `tokenspeed_scheduler` 0.1.0 API: the
TokenSpeed reference wheel and kvtier's drop-in module. Both run the same driver, in
interleaved rounds (round 1: reference then ours, round 2: ours then reference, ...), each
run a fresh scheduler taking the whole workload. Every run is verified: its counters must
equal the reference counters WORKLOADS.md §5 publishes (and what §3's definition implies),
and both modules' counters must equal each other; any mismatch is reported and the script
exits with status 1.

Timed: each step as a Python engine pays it, `next_execution_plan()` + reading the plan and
building the `ExecutionEvent` + `advance()`. The steady window is §3's: decode steps 2-510
(509 steps). Each run yields the p50 and mean over its steady steps; the summary is the
median over rounds of those, per module, and the ratio ours / reference. WORKLOADS.md's own
metric leaves the event building out (`NextExecutionPlan` + `Advance` only); that figure is
reported beside it as "plan+advance".

    PY=target/tools/py-venv/bin/python
    # the reference wheel alone (counters checked against WORKLOADS.md)
    $PY crates/kvtier-py/bench/w2.py --reference-path target/tools/reference-wheel
    # reference vs kvtier's extension module, in-tree build
    $PY crates/kvtier-py/bench/w2.py --reference-path target/tools/reference-wheel \
        --ours kvtier._native:tokenspeed --ours-path crates/kvtier-py/python --json /tmp/w2.json
    # reference vs an installed kvtier wheel's drop-in `tokenspeed_scheduler`
    $PY crates/kvtier-py/bench/w2.py --reference-path target/tools/reference-wheel \
        --ours tokenspeed_scheduler
"""

import argparse
import gc
import hashlib
import importlib
import importlib.machinery
import json
import os
import platform
import re
import statistics
import sys
import time

# ---------------------------------------------------------------------------------------
# The workload (WORKLOADS.md §1 and §3)
# ---------------------------------------------------------------------------------------

# §1's token streams, shared with tools/reference/hybrid_workloads.py.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tools", "reference"))
from token_streams import M64, gen, tag  # noqa: E402

PROMPT_TOKENS = 2048  # §3: prompt gen(tag(2,1,r), 2048)
MAX_NEW = 512  # §3: generated stream gen(tag(2,2,r), 512) = max_new_tokens
BUDGET = 8192  # §1: max_scheduled_tokens
STEADY = range(2, 511)  # §3: decode steps 2..510 are the steady state (509 steps)
LAST_DECODE = MAX_NEW - 1  # the first token comes from the last prefill chunk

# §5: the reference counters published for W2 (TokenSpeed C++, deterministic). The table
# gives them per N, for P = 64 and P = 16 alike (the phases do not depend on P).
PUBLISHED = {
    256: {"steps": 576, "prefill_steps": 64},
    1024: {"steps": 768, "prefill_steps": 256},
}


# §1's check vectors: (w, k, i) -> first 6 tokens.
CHECK_VECTORS = {
    (2, 1, 0): [13673, 6335, 15376, 8618, 2261, 17134],
    (1, 1, 0): [30267, 11237, 4704, 20780, 20086, 23116],
    (1, 2, 0): [14641, 19661, 8536, 27042, 18717, 14185],
    (3, 1, 0): [9293, 31015, 11167, 6654, 9665, 9032],
}


# The counters of a run, in report order: the Rust driver's (crates/kvtier-sim/src/engine.rs,
# `Counters`, less the KV-event ones), W2's phases, and a digest of every plan's rows.
COUNTERS = [
    "steps", "prefill_steps", "decode_steps", "steady_steps", "empty_plans",
    "non_lockstep_decode_steps", "prompt_tokens", "prefill_rows", "non_first_chunks",
    "decode_rows", "hit_tokens", "hit_tokens_device", "hit_tokens_host", "writeback_ops",
    "writeback_pages", "finish_writeback_ops", "finish_writeback_pages", "retract_writeback_ops",
    "retract_writeback_pages", "retractions", "loadback_ops", "loadback_pages",
    "recovery_loadback_pages", "starved_decode_slots", "finished", "aborts", "plan_rows_digest",
]


class W2:
    """W2 with N requests at page size P: its token streams, ids, config and expectations."""

    def __init__(self, n, page_size):
        for (w, k, i), first in CHECK_VECTORS.items():
            assert gen(tag(w, k, i), 6) == first, f"token generator check vector ({w},{k},{i})"
        self.n = n
        self.page_size = page_size
        # Ids are part of the definition: the scheduler orders candidates by id string.
        self.ids = ["r%05d" % r for r in range(n)]
        self.prompts = [gen(tag(2, 1, r), PROMPT_TOKENS) for r in range(n)]
        self.streams = [gen(tag(2, 2, r), MAX_NEW) for r in range(n)]
        # §3: room for every request's 2,560 tokens plus two pages, and page 0 reserved.
        self.total_pages = n * (-(-(PROMPT_TOKENS + MAX_NEW) // page_size) + 2) + 1

    def config(self, ts):
        """§1's common config plus §3's; every other field at its default."""
        c = ts.SchedulerConfig()
        c.page_size = self.page_size
        c.decode_input_tokens = 1
        c.enable_l3_storage = False
        c.max_scheduled_tokens = BUDGET
        c.max_batch_size = self.n
        c.num_device_pages = self.total_pages
        c.num_host_pages = 0
        c.disable_l2_cache = True
        return c

    def expected(self):
        """{counter: (value, source)}: §5's published counters, and what §3's definition
        implies (lockstep phases, whole-prompt prefill rows, no cache traffic)."""
        n = self.n
        prefill_steps = n * PROMPT_TOKENS // BUDGET
        implied = {
            "steps": prefill_steps + LAST_DECODE + 1,
            "prefill_steps": prefill_steps,
            "decode_steps": LAST_DECODE,
            "steady_steps": len(STEADY),
            "empty_plans": 1,
            "non_lockstep_decode_steps": 0,
            "prompt_tokens": n * PROMPT_TOKENS,
            "prefill_rows": n,  # 8,192 / 2,048: four whole prompts per prefill step
            "non_first_chunks": 0,
            "decode_rows": n * LAST_DECODE,
            "hit_tokens": 0,
            "hit_tokens_host": 0,
            "writeback_ops": 0,
            "writeback_pages": 0,
            "retractions": 0,
            "loadback_ops": 0,
            "loadback_pages": 0,
            "starved_decode_slots": 0,
            "finished": n,
            "aborts": 0,
        }
        out = {k: (v, "§3") for k, v in implied.items()}
        for k, v in PUBLISHED.get(n, {}).items():
            assert implied[k] == v, f"§3 implies {k} = {implied[k]}, §5 publishes {v}"
            out[k] = (v, "§5")
        return out


def check_published_against_doc(doc):
    """Cross-checks PUBLISHED against WORKLOADS.md §5 where the file is at hand, so that a
    change to the definition cannot leave this script checking stale numbers."""
    if not os.path.exists(doc):
        return f"{doc} not found; using the counters built into this script"
    pattern = re.compile(
        r"^\|\s*W2, N=(\d+)\s*\|\s*steps\s*\|\s*([\d,]+) including the final empty plan "
        r"\((\d+) prefill steps\)"
    )
    found = {}
    with open(doc, encoding="utf-8") as f:
        for line in f:
            m = pattern.match(line)
            if m:
                n, steps, prefill = (int(g.replace(",", "")) for g in m.groups())
                found[n] = {"steps": steps, "prefill_steps": prefill}
    if found != PUBLISHED:
        sys.exit(f"error: {doc} §5 publishes W2 counters {found}, this script has {PUBLISHED}")
    return f"{doc} §5 agrees with the counters built into this script"


# ---------------------------------------------------------------------------------------
# Loading the modules under test
# ---------------------------------------------------------------------------------------


def load_module(spec, path=None):
    """Imports `module` or `module:attribute` (e.g. `kvtier._native:tokenspeed`), with `path`
    first on sys.path for the import only. Returns (API object, where it came from).

    A package of the same top-level name imported before (the reference wheel's
    `tokenspeed_scheduler`) is set aside from sys.modules first, so the reference and
    kvtier's drop-in of the same name can be driven in one process; the objects already
    returned stay alive and usable."""
    name, _, attr = spec.partition(":")
    top = name.split(".")[0]
    loaded = sys.modules.get(top)
    if loaded is not None:
        # Importing the same package a second time would re-initialise its extension
        # (nanobind aborts the process on that), so refuse it here with a readable error.
        search = ([os.path.abspath(path)] if path is not None else []) + sys.path
        found = importlib.machinery.PathFinder.find_spec(top, search)
        if found is not None and found.origin == getattr(loaded, "__file__", None):
            sys.exit(f"error: {spec} resolves to {found.origin}, the module already loaded "
                     "(the reference); is kvtier's wheel installed, or --ours-path right?")
    for key in [k for k in sys.modules if k == top or k.startswith(top + ".")]:
        # Kept registered under another name, so that interpreter shutdown still tears the
        # set-aside extension down in order (nanobind reports leaks otherwise).
        sys.modules["_w2_set_aside." + key] = sys.modules.pop(key)
    if path is not None:
        sys.path.insert(0, os.path.abspath(path))
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        sys.exit(f"error: cannot import {spec}"
                 + (f" with {path} first on sys.path" if path is not None else "") + f": {e}")
    finally:
        if path is not None:
            sys.path.remove(os.path.abspath(path))
    obj = getattr(module, attr) if attr else module
    for needed in ("Scheduler", "SchedulerConfig", "RequestSpec", "ExecutionEvent",
                   "ForwardEvent", "Cache"):
        if not hasattr(obj, needed):
            sys.exit(f"error: {spec} has no {needed}; not a tokenspeed_scheduler 0.1.0 API")
    origin = getattr(module, "__file__", None) or repr(module)
    return obj, origin + (f" (attribute {attr})" if attr else "")


# ---------------------------------------------------------------------------------------
# One run: a fresh scheduler through the whole workload
# ---------------------------------------------------------------------------------------


def run_once(ts, w):
    """Runs W2 once on module `ts`. Returns (counters, timings): counters as the Rust
    driver (crates/kvtier-sim/src/engine.rs) counts them plus W2's phases and a digest of
    every plan's rows; timings per steady step, in ns."""
    sched = ts.Scheduler(w.config(ts))
    specs = []
    for rid, prompt in zip(w.ids, w.prompts):
        s = ts.RequestSpec()
        s.request_id = rid
        s.tokens = prompt
        specs.append(s)
    stream = dict(zip(w.ids, w.streams))
    produced = dict.fromkeys(w.ids, 0)
    sched.submit_requests(specs)  # §3: all N in one call before step 1 (not timed)

    ExecutionEvent = ts.ExecutionEvent
    ExtendResult = ts.ForwardEvent.ExtendResult
    Finish = ts.ForwardEvent.Finish
    WriteBackOp = ts.Cache.WriteBackOp
    LoadBackOp = ts.Cache.LoadBackOp
    WriteBackDoneEvent = ts.Cache.WriteBackDoneEvent
    clock = time.perf_counter_ns

    c = dict.fromkeys(COUNTERS, 0)
    digest = hashlib.blake2b(digest_size=8)
    started = set()  # requests whose first prefill chunk has been seen
    generating = 0  # requests past their first token and not finished
    step_ns, sched_ns = [], []  # steady steps only
    edge_ns = {}  # first decode step and last step, for the report
    step_limit = 10 * (w.n * PROMPT_TOKENS // BUDGET + MAX_NEW)  # a safety net only

    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()  # no collector pauses inside timed steps (nothing here makes cycles)
    try:
        while True:
            t0 = clock()
            plan = sched.next_execution_plan()
            t1 = clock()
            # --- the engine (§1 "Engine simulation"), timed: an engine pays for reading
            # the plan through the API and building the event.
            ev = ExecutionEvent()
            cache = plan.cache
            for op in cache:  # 1. every write-back op acknowledged, first
                if isinstance(op, WriteBackOp):
                    for op_id in op.op_ids:
                        done = WriteBackDoneEvent()
                        done.op_id = op_id
                        done.success = True
                        ev.add_event(done)
            # 2. load-backs need no reply. 3. forward rows, prefill rows first.
            fwd = plan.forward[0]
            rids = fwd.request_ids
            n_ext = fwd.num_extends()
            if n_ext:
                prefix_lens = fwd.extend_prefix_lens
                input_lens = fwd.input_lengths
                prefill_lens = fwd.prefill_lengths
            finished = 0
            for i, rid in enumerate(rids):
                if i < n_ext and prefix_lens[i] + input_lens[i] != prefill_lens[i]:
                    continue  # a prefill chunk that is not the prompt's last: nothing
                k = produced[rid]
                produced[rid] = k + 1
                e = ExtendResult()
                e.request_id = rid
                e.tokens = [stream[rid][k]]
                ev.add_event(e)
                if k + 1 == MAX_NEW:  # its last token: Finish right after it
                    f = Finish()
                    f.request_id = rid
                    ev.add_event(f)
                    finished += 1
            t2 = clock()
            sched.advance(ev)  # the empty plan's (empty) event too, as the Rust driver does
            t3 = clock()

            # --- counting, not timed
            c["steps"] += 1
            empty = not rids and not cache
            if n_ext:
                c["prefill_steps"] += 1
                phase = 0
            elif not empty:
                c["decode_steps"] += 1
                phase = c["decode_steps"]
                if phase in STEADY:
                    c["steady_steps"] += 1
                    step_ns.append(t3 - t0)
                    sched_ns.append((t1 - t0) + (t3 - t2))
                elif phase in (1, LAST_DECODE):
                    edge_ns["first_decode" if phase == 1 else "last_decode"] = t3 - t0
            for op in cache:
                pages = sum(len(p) for p in op.src_pages)
                if isinstance(op, WriteBackOp):
                    for retract, src in zip(op.is_retract, op.src_pages):
                        kind = "retract" if retract else "finish"
                        c[kind + "_writeback_ops"] += 1
                        c[kind + "_writeback_pages"] += len(src)
                        c["retractions"] += bool(retract)
                    c["writeback_ops"] += len(op.op_ids)
                    c["writeback_pages"] += pages
                elif isinstance(op, LoadBackOp):
                    c["loadback_ops"] += len(op.op_ids)
                    c["loadback_pages"] += pages
                    if n_ext:  # §1: load-backs in prefill plans are prefix hits
                        c["hit_tokens_host"] += pages * w.page_size
                    else:
                        c["recovery_loadback_pages"] += pages
            decode_rows = len(rids) - n_ext
            yielded_prefill = 0
            for i in range(n_ext):
                rid = rids[i]
                c["prefill_rows"] += 1
                if rid in started:
                    c["non_first_chunks"] += 1
                else:
                    started.add(rid)
                    c["hit_tokens"] += prefix_lens[i]
                yielded_prefill += prefix_lens[i] + input_lens[i] == prefill_lens[i]
            c["decode_rows"] += decode_rows
            if not n_ext:
                c["starved_decode_slots"] += max(0, generating - decode_rows)
                if not empty and decode_rows != w.n:
                    c["non_lockstep_decode_steps"] += 1
            generating += yielded_prefill - finished
            c["finished"] += finished
            digest.update(b"%d|%d|" % (n_ext, len(cache)) + ",".join(rids).encode() + b"\n")
            if empty:
                c["empty_plans"] += 1
                break
            if c["steps"] > step_limit:
                raise RuntimeError(f"W2 stalled: {c['steps']} steps without an empty plan")
    finally:
        if gc_was_enabled:
            gc.enable()
    c["prompt_tokens"] = w.n * PROMPT_TOKENS
    c["hit_tokens_device"] = c["hit_tokens"] - min(c["hit_tokens_host"], c["hit_tokens"])
    c["aborts"] = w.n - c["finished"]  # requests the run lost without a Finish
    c["plan_rows_digest"] = digest.hexdigest()
    return c, {"step": step_ns, "sched": sched_ns, **edge_ns}


def summarize(ns):
    """(p50, mean) in µs of one run's steady steps (p50 as the Rust driver takes it)."""
    return sorted(ns)[len(ns) // 2] / 1e3, sum(ns) / len(ns) / 1e3


# ---------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------


def main():
    repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reference-path", metavar="DIR",
                   help="directory put first on sys.path to import the reference module "
                        "(e.g. target/tools/reference-wheel)")
    p.add_argument("--module", metavar="MOD[:ATTR]",
                   help="the reference module (default tokenspeed_scheduler, imported by name; "
                        "implied by --reference-path)")
    p.add_argument("--ours", metavar="MOD[:ATTR]",
                   help="kvtier's module with the same API, e.g. tokenspeed_scheduler (installed "
                        "kvtier wheel) or kvtier._native:tokenspeed")
    p.add_argument("--ours-path", metavar="DIR",
                   help="directory put first on sys.path to import --ours "
                        "(e.g. crates/kvtier-py/python)")
    p.add_argument("--n", type=int, default=256, choices=sorted(PUBLISHED),
                   help="W2's N (default 256)")
    p.add_argument("--page-size", type=int, default=64, choices=[64, 16],
                   help="W2's P (default 64)")
    p.add_argument("--rounds", type=int, default=11, help="interleaved rounds (default 11)")
    p.add_argument("--quick", action="store_true", help="3 rounds (CI smoke)")
    p.add_argument("--json", metavar="FILE", help="write a JSON summary here")
    p.add_argument("--workloads-md", metavar="FILE",
                   default=os.path.join(repo, "..", "shared", "design", "WORKLOADS.md"),
                   help="WORKLOADS.md to cross-check the published counters against")
    a = p.parse_args()
    rounds = 3 if a.quick else a.rounds
    if rounds < 1:
        p.error("--rounds must be at least 1")

    modules, origins = {}, {}  # label -> API object / where it came from; reference first
    if a.reference_path or a.module:
        modules["reference"], origins["reference"] = load_module(
            a.module or "tokenspeed_scheduler", a.reference_path)
    if a.ours:
        modules["ours"], origins["ours"] = load_module(a.ours, a.ours_path)
    if not modules:
        p.error("nothing to drive: give --reference-path/--module and/or --ours")
    if len(modules) == 2 and (modules["reference"].Scheduler is modules["ours"].Scheduler
                              or origins["reference"] == origins["ours"]):
        sys.exit(f"error: the reference and ours are the same module ({origins['ours']}); "
                 "is kvtier's wheel installed, or --ours-path right?")

    doc_note = check_published_against_doc(os.path.normpath(a.workloads_md))
    t_gen = time.perf_counter()
    w = W2(a.n, a.page_size)
    expected = w.expected()
    print(f"W2 N={w.n} P={w.page_size}: total_pages={w.total_pages}, max_batch_size={w.n}, "
          f"token streams built in {time.perf_counter() - t_gen:.1f} s")
    print(f"  {doc_note}")
    for label, origin in origins.items():
        print(f"  {label:9} = {origin}")

    # Interleaved rounds: odd rounds in the given order, even rounds reversed.
    labels = list(modules)
    runs = {label: [] for label in labels}  # label -> [(counters, timings)]
    for r in range(rounds):
        order = labels if r % 2 == 0 else labels[::-1]
        line = []
        for label in order:
            counters, timings = run_once(modules[label], w)
            runs[label].append((counters, timings))
            p50, mean = summarize(timings["step"])
            line.append(f"{label} p50 {p50:7.1f} µs mean {mean:7.1f} µs")
        print(f"  round {r + 1:2}/{rounds}: " + "; ".join(line), flush=True)

    # --- verification
    failures = []
    final = {}
    for label in labels:
        first = runs[label][0][0]
        final[label] = first
        for i, (counters, _) in enumerate(runs[label][1:], start=2):
            if counters != first:
                diff = {k: (first[k], counters[k]) for k in first if first[k] != counters[k]}
                failures.append(f"{label}: round {i}'s counters differ from round 1's: {diff}")
        for k, (want, src) in expected.items():
            if first[k] != want:
                failures.append(f"{label}: {k} = {first[k]}, WORKLOADS.md {src} gives {want}")
    if len(labels) == 2:
        ref, ours = final["reference"], final["ours"]
        for k in ref:
            if ref[k] != ours[k]:
                failures.append(f"reference and ours differ: {k} = {ref[k]} vs {ours[k]}")

    print()
    print(f"{'counter':26} {'WORKLOADS.md':>14} " + " ".join(f"{l:>16}" for l in labels))
    for k in final[labels[0]]:
        want = f"{expected[k][0]} ({expected[k][1]})" if k in expected else "-"
        vals = [final[l][k] for l in labels]
        bad = (k in expected and any(v != expected[k][0] for v in vals)) or len(set(vals)) > 1
        print(f"{k:26} {want:>14} " + " ".join(f"{v:>16}" for v in vals)
              + ("   <-- MISMATCH" if bad else ""))

    # --- timing summary: per module, the median over rounds of each run's p50 and mean
    timing = {}
    for label in labels:
        per_run = [dict(zip(("p50_us", "mean_us"), summarize(t["step"])))
                   | dict(zip(("sched_p50_us", "sched_mean_us"), summarize(t["sched"])))
                   | {"first_decode_us": t.get("first_decode", 0) / 1e3,
                      "last_decode_us": t.get("last_decode", 0) / 1e3}
                   for _, t in runs[label]]
        med = {k: statistics.median(run[k] for run in per_run) for k in per_run[0]}
        spread = {k: [min(run[k] for run in per_run), max(run[k] for run in per_run)]
                  for k in ("p50_us", "mean_us")}
        timing[label] = {"median": med, "min_max": spread, "per_run": per_run}
    ratio = None
    if len(labels) == 2:
        ratio = {k: timing["ours"]["median"][k] / timing["reference"]["median"][k]
                 for k in ("p50_us", "mean_us", "sched_p50_us", "sched_mean_us")}

    print()
    print(f"steady step = decode steps {STEADY.start}-{STEADY.stop - 1} ({len(STEADY)} steps); "
          f"µs, median over {rounds} rounds of each run's p50 / mean")
    print(f"{'module':10} {'step p50':>10} {'step mean':>10} {'p50 min-max':>17} "
          f"{'plan+adv p50':>13} {'plan+adv mean':>14}")
    for label in labels:
        m, s = timing[label]["median"], timing[label]["min_max"]["p50_us"]
        print(f"{label:10} {m['p50_us']:10.1f} {m['mean_us']:10.1f} "
              f"{s[0]:8.1f}-{s[1]:<8.1f} {m['sched_p50_us']:13.1f} {m['sched_mean_us']:14.1f}")
    if ratio:
        print(f"{'ours/ref':10} {ratio['p50_us']:10.3f} {ratio['mean_us']:10.3f} {'':17} "
              f"{ratio['sched_p50_us']:13.3f} {ratio['sched_mean_us']:14.3f}")
    print("  step = next_execution_plan() + reading the plan and building the event + advance();"
          " plan+adv = the two calls alone (WORKLOADS.md's metric)")

    if a.json:
        summary = {
            "workload": "w2", "n": w.n, "page_size": w.page_size, "total_pages": w.total_pages,
            "rounds": rounds, "steady_decode_steps": [STEADY.start, STEADY.stop - 1],
            "command": sys.argv,
            "machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                        "cpus": os.cpu_count()},
            "modules": {label: {"spec": (a.module or "tokenspeed_scheduler")
                                if label == "reference" else a.ours,
                                "origin": origins[label]} for label in labels},
            "expected": {k: {"value": v, "source": s} for k, (v, s) in expected.items()},
            "counters": final,
            "timing_us": timing,
            "ratio_ours_over_reference": ratio,
            "ok": not failures,
            "failures": failures,
        }
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")

    if failures:
        print("\n" + "!" * 78, file=sys.stderr)
        print("W2 VERIFICATION FAILED:", file=sys.stderr)
        for msg in failures:
            print("  " + msg, file=sys.stderr)
        print("!" * 78, file=sys.stderr)
        sys.exit(1)
    print("\ncounters verified: every run matches WORKLOADS.md"
          + (" and the two modules match each other" if len(labels) == 2 else ""))


if __name__ == "__main__":
    main()

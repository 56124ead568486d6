#!/usr/bin/env python3
"""Differential testing of two `tokenspeed_scheduler`-compatible modules.

The reference is TokenSpeed's scheduler module `tokenspeed_scheduler` 0.1.0 (C++,
nanobind); the other side is normally kvtier's drop-in with the same API. Both are
driven by the same random but *valid* script, step by step, and every observable
output is compared after each `next_execution_plan()` and each `advance()`:

* the forward batch (rows, pages, token ids, prefix lengths, decode fields; Mamba
  slots and paged-cache block tables for hybrid configs),
* the cache ops (write-backs as a multiset, load-backs in order),
* the KV events of `drain_kv_events()`,
* the size queries and `get_request_token_size` of every submitted request.

A *script* is plain data (a dict literal): a `SchedulerConfig` as a dict, the requests
(id, arrival step, prompt, number of tokens to generate, optional abort step, optional
reserve updates), the write-back acknowledgement delays per plan step, and a step limit.
It holds intentions only. Each side has its own *driver* that turns its own plans into
events by the same deterministic rules (the ones of tools/reference/smoke.py):

* `ExtendResult` for a prefill row that completes the prompt and for every decode row,
  with a token that is a function of (request id, index) only;
* `Finish` right after the ExtendResult that produced the request's last token;
* `WriteBackDone(success=True)` for every op id of the plan's `WriteBackOp`, in the same
  advance or k steps later (the script's delay for the plan's step), in kvtier's op
  order, the reference's matching ops (same source pages) in the same order
  (`Comparator.ack_order`);
* `UpdateReserveNumTokens` after a request's k-th decode row (it is Decoding then);
* `Abort` at the chosen step if the request was submitted and not yet finished/aborted.

Since the two sides must produce the same plans, they also send the same events; the run
stops at the first divergence, which is then shrunk to a small script that still
diverges and printed as a Python literal for `--replay FILE`.

Ids that are allocator choices are compared through bijections learned as ids first
appear (device pages, host pages, Mamba slots, paged-group pages, op ids), and the
report says whether they were also exactly equal throughout; request-pool indices are
compared exactly (see ID_MODES; `--id-mode pool=bijection` relaxes them).

Scripts run in a forked child (one per batch, a new one after a crash), so that a
segfault is reported with its seed instead of ending the run; `--no-isolate` turns that
off. Scripts are generated inside the region where the reference is sound: plain KV
configs never crashed it or made it raise in 15,000 seeds, hybrid ones in 10,000 (see
the comments in `_add_hybrid` for the regions left out and why).

Usage (the reference wheel unpacked in target/tools/reference-wheel, Python 3.11):
    python differential.py --self-check --seeds 0:300      # reference vs itself
    python differential.py --mutation-check --seeds 0:40   # the harness finds planted bugs
    python differential.py --seeds 0:300 [--hybrid] [--ours MODULE_OR_PATH]
                           [--reference-path DIR] [--known known.json]
    python differential.py --replay FILE [--trace]         # one (shrunk) script
    python differential.py --seeds 7 --print-script        # the script of a seed

`--ours` defaults to `kvtier.compat` (crates/kvtier-py/python is appended to sys.path
for an in-place build). The exit status is 1 when a divergence is not covered by
`--known` (a JSON list of {"what": regex on the divergence's field, optional "detail":
regex on both values and the note, "seeds": [...], "hybrid": bool, "note": text}), or
when the reference crashed; 2 when the module under test cannot be loaded.

The library entry points are `generate_script`, `run_script`, `run_many`,
`shrink_script`, `load_reference`, `load_module`, `mutation_check` and `main(argv)`.
"""

from __future__ import annotations

import argparse
import ast
import collections
import faulthandler
import importlib
import importlib.util
import json
import os
import random
import re
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DEFAULT_REFERENCE_PATH = REPO / "target" / "tools" / "reference-wheel"
# kvtier's drop-in under a name that does not clash with the reference's package; its
# in-place build (maturin develop) lives in crates/kvtier-py/python, which is appended to
# sys.path so that an installed kvtier, if any, comes first.
DEFAULT_OURS = "kvtier.compat"
KVTIER_PYTHON_DIR = REPO / "crates" / "kvtier-py" / "python"

SCRIPT_VERSION = 1
VOCAB = 40  # token ids are 1..VOCAB: small, so that prompts and outputs collide often

# How each id namespace is compared: "exact" (ids must be equal), "bijection" (a
# consistent one-to-one mapping learned as ids appear) or "any" (only the shape and the
# -1 sentinels are compared). Exact equality is tracked in every mode and reported.
ID_MODES = {
    "pool": "exact",         # request_pool_indices
    "device": "bijection",   # KV device pages
    "host": "bijection",     # KV host pages
    "mamba": "bijection",    # Mamba device slots
    "mamba_host": "bijection",
    "op": "bijection",       # cache op ids
    "group": "bijection",    # paged-cache group pages (one namespace per group)
}


# --------------------------------------------------------------------------------------
# Loading the modules
# --------------------------------------------------------------------------------------

def load_reference(path: str | os.PathLike | None = None):
    """Imports the reference `tokenspeed_scheduler` with `path` first on sys.path."""
    path = str(path or DEFAULT_REFERENCE_PATH)
    if path not in sys.path:
        sys.path.insert(0, path)
    existing = sys.modules.get("tokenspeed_scheduler")
    if existing is not None:
        origin = getattr(existing, "__file__", "") or ""
        if not origin.startswith(path):
            raise ImportError(f"tokenspeed_scheduler already imported from {origin}, not from {path}")
        return existing
    return importlib.import_module("tokenspeed_scheduler")


def load_module(spec: str, alias: str = "_differential_ours", extra_paths=()):
    """Loads the module under test.

    `spec` is either a dotted module name (e.g. `kvtier._native.tokenspeed`), or a path:
    a package directory (its `__init__.py` is loaded under `alias`, so it may be called
    `tokenspeed_scheduler` like the reference without clashing), or a `.py`/`.so` file.
    `extra_paths` go to the front of sys.path first. For a package directory, its parent
    is appended to sys.path (so `kvtier` next to kvtier's `tokenspeed_scheduler` is found
    when nothing installed shadows it).
    """
    for p in reversed(list(extra_paths)):
        sys.path.insert(0, str(p))
    path = Path(spec)
    if path.exists():
        path = path.resolve()
        if path.is_dir():
            init = path / "__init__.py"
            if not init.exists():
                raise ImportError(f"{path} has no __init__.py")
            if str(path.parent) not in sys.path:
                sys.path.append(str(path.parent))
            mspec = importlib.util.spec_from_file_location(alias, init, submodule_search_locations=[str(path)])
        else:
            mspec = importlib.util.spec_from_file_location(alias, path)
        if mspec is None or mspec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(mspec)
        sys.modules[alias] = module
        mspec.loader.exec_module(module)
        return module
    if str(KVTIER_PYTHON_DIR) not in sys.path:
        sys.path.append(str(KVTIER_PYTHON_DIR))
    try:
        return importlib.import_module(spec)
    except ImportError:
        # A submodule that an extension defines as an attribute only
        # (e.g. kvtier._native.tokenspeed): import the parent, then walk attributes.
        parent, _, attr = spec.rpartition(".")
        if not parent:
            raise
        module = load_module(parent, alias, ())
        try:
            return getattr(module, attr)
        except AttributeError:
            raise ImportError(f"{parent} has no attribute {attr}") from None


# --------------------------------------------------------------------------------------
# Scripts: generation and validity
# --------------------------------------------------------------------------------------

def gen_token(rid: str, index: int) -> int:
    """The token a request samples at output position `index` (same on both sides)."""
    return 1 + zlib.crc32(f"{rid}#{index}".encode()) % VOCAB


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def l2_active(cfg: dict) -> bool:
    return cfg.get("num_host_pages", 0) >= 2 and not cfg.get("disable_l2_cache", False)


def request_peak_tokens(cfg: dict, req: dict) -> int:
    """Token slots a request can hold at once: prompt, outputs and the decode reserve."""
    reserve = max([cfg.get("decode_input_tokens", 1)] + list(req.get("reserve", {}).values()))
    return len(req["prompt"]) + req["gen"] + reserve


def request_device_pages(cfg: dict, req: dict) -> int:
    return cdiv(request_peak_tokens(cfg, req), cfg["page_size"])


def group_pages_needed(group: dict, tokens: int, budget: int, required: bool) -> int:
    """Pages one request may need in a paged-cache group (kvtier's `short_group` rule,
    applied to the request's peak token count, plus one page of slack)."""
    def pages_for(t: int) -> int:
        return cdiv(cdiv(t, group["entry_stride_tokens"]), group["rows_per_page"])

    window = group.get("sliding_window_tokens") if group.get("retention") == "SlidingWindow" else None
    if window is None or (required and group.get("family", "History") == "History"):
        need = pages_for(tokens)
    else:
        first = pages_for(min(budget, tokens))
        later = pages_for(window - 1 + min(budget, max(0, tokens - budget))) + 1 if tokens > budget else 0
        need = max(first, later, pages_for(window) + 1)
    return need + 1


def script_problems(script: dict) -> list[str]:
    """Why a script is not valid (empty when it is). Valid scripts never make either
    module refuse a request or a config, and never crash the reference."""
    problems = []
    cfg = script["config"]
    for key in ("page_size", "max_scheduled_tokens", "max_batch_size"):
        if cfg.get(key, 0) <= 0:
            problems.append(f"config {key} must be > 0")
    if problems:
        return problems
    if cfg.get("decode_input_tokens", 1) < 0:
        problems.append("decode_input_tokens < 0")
    usable = cfg.get("num_device_pages", 0) - 1
    if usable < 1:
        problems.append("no usable device pages")
    if cfg.get("enable_mamba") and cfg.get("mamba_pool_total_chunks", 0) < 2:
        problems.append("mamba needs >= 2 slots")
    if cfg.get("enable_mamba") and cfg.get("paged_cache_groups"):
        problems.append("kvtier does not serve mamba + paged groups together")
    if cfg.get("enable_mamba") and cfg.get("mamba_cache_chunk_size", 0) <= 0:
        problems.append("mamba_cache_chunk_size must be > 0")
    if cfg.get("enable_mamba_l2") and cfg.get("mamba_l2_host_slots", 0) > 0 and not l2_active(cfg):
        problems.append("mamba host slots without L2")
    # Regions where the reference itself is unsound (see _add_hybrid).
    groups = {g["group_id"]: g for g in cfg.get("paged_cache_groups") or []}
    for gid in cfg.get("prefix_cache_adjunct") or []:
        g = groups.get(gid)
        if g is None:
            problems.append(f"adjunct names unknown group {gid}")
        elif g["rows_per_page"] * g["entry_stride_tokens"] != cfg["page_size"]:
            problems.append(f"required group {gid}: a group page must hold one KV page of tokens")
    if cfg.get("prefix_cache_adjunct") and cfg.get("num_host_pages", 0) >= 2:
        problems.append("adjunct with a host pool")
    ids = set()
    for req in script["requests"]:
        rid = req["id"]
        if rid in ids:
            problems.append(f"duplicate request id {rid}")
        ids.add(rid)
        if not req["prompt"]:
            problems.append(f"{rid}: empty prompt")
        if any(t < 1 for t in req["prompt"]):
            problems.append(f"{rid}: token < 1")
        if req["gen"] < 1:
            problems.append(f"{rid}: gen < 1")
        if request_device_pages(cfg, req) > usable:
            problems.append(f"{rid}: needs {request_device_pages(cfg, req)} device pages, {usable} usable")
        required = set(cfg.get("prefix_cache_adjunct") or [])
        for g in cfg.get("paged_cache_groups") or []:
            need = group_pages_needed(g, request_peak_tokens(cfg, req), cfg["max_scheduled_tokens"],
                                      g["group_id"] in required)
            if need > g["total_pages"] - 1:
                problems.append(f"{rid}: needs {need} pages of group {g['group_id']}, {g['total_pages'] - 1} usable")
        if req.get("abort_at") is not None and req["abort_at"] < req["arrive"]:
            problems.append(f"{rid}: abort before arrival")
        for value in req.get("reserve", {}).values():
            if value < cfg.get("decode_input_tokens", 1):
                problems.append(f"{rid}: reserve below decode_input_tokens")
    return problems


def _random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(1, VOCAB) for _ in range(n)]


def generate_script(seed: int, hybrid: bool = False) -> dict:
    """A random valid script, a deterministic function of (seed, hybrid)."""
    rng = random.Random(seed * 2 + (1 if hybrid else 0))
    page = rng.choice([1, 2, 4, 8])
    dit = 1 if rng.random() < 0.85 else 2
    max_prompt = page * 10 if page > 1 else 16
    # "Pressure" scripts: many requests at once, long outputs, a pool barely larger than
    # one request, so that decodes run out of pages and the scheduler retracts.
    pressure = rng.random() < 0.3

    # A few shared prefixes (often page aligned, sometimes not), prompts drawn from them.
    unit = max(page, 2)
    prefixes = []
    for _ in range(rng.randint(1, 3)):
        n = rng.randint(1, 4) * unit + (rng.randint(0, page) if rng.random() < 0.3 else 0)
        prefixes.append(_random_tokens(rng, n))
    n_req = rng.randint(4, 10) if pressure else rng.randint(2, 10)
    requests = []
    for i in range(n_req):
        rid = f"r{i:02d}"
        roll = rng.random()
        arrive = 0 if rng.random() < 0.5 else rng.randint(1, 5 if pressure else 50)
        if roll < 0.5:
            prompt = list(rng.choice(prefixes)) + _random_tokens(rng, rng.randint(0, 3 * unit))
        elif roll < 0.62 and requests:
            prompt = list(rng.choice(requests)["prompt"])  # an exact repeat
        elif roll < 0.8 and requests:
            # A follow-up turn: an earlier prompt, its outputs, a new tail; arrives later.
            prev = rng.choice(requests)
            prompt = prev["prompt"] + [gen_token(prev["id"], k) for k in range(prev["gen"])]
            prompt += _random_tokens(rng, rng.randint(1, 2 * unit))
            arrive = prev["arrive"] + rng.randint(3, 40)
        else:
            prompt = _random_tokens(rng, rng.randint(1, 5 * unit))
        prompt = prompt[:max_prompt] or _random_tokens(rng, 1)
        gen = rng.randint(1, 4) if rng.random() < 0.3 and not pressure else rng.randint(4, 16)
        req = {"id": rid, "arrive": arrive, "prompt": prompt, "gen": gen, "abort_at": None, "reserve": {}}
        if rng.random() < 0.2:
            req["abort_at"] = arrive + rng.randint(0, 20)
        if rng.random() < 0.15 and gen > 1:
            for _ in range(rng.randint(1, 2)):
                req["reserve"][rng.randint(1, gen - 1)] = rng.randint(dit, dit + 2 * page)
        requests.append(req)
    # Submission order within one step is the list order: shuffle it, so that ids are
    # not submitted in sorted order (the reference orders candidates by id anyway).
    rng.shuffle(requests)

    cfg = {
        "page_size": page,
        "decode_input_tokens": dit,
        "max_batch_size": rng.randint(3, 8) if pressure else rng.choice([1, rng.randint(2, 8), rng.randint(2, 8)]),
        "max_scheduled_tokens": rng.choice([rng.randint(1, 2 * page + 2), rng.randint(page, 6 * page), 64]),
        "enable_mixed_prefill_decode": rng.random() < 0.3,
        "enable_kv_cache_events": True,
        "disable_l2_cache": rng.random() < 0.15,
        "disable_prefix_cache": rng.random() < 0.05,
    }
    needs = [request_device_pages(cfg, r) for r in requests]
    # Tight pools (a request or two) make retraction and eviction common; some roomy ones.
    extra = rng.choice([0, 1, 2, rng.randint(0, max(needs)), rng.randint(0, max(1, sum(needs) // 2)),
                        rng.randint(0, sum(needs))])
    if pressure:
        extra = rng.choice([0, 1, 2, rng.randint(0, max(needs))])
    cfg["num_device_pages"] = 1 + max(needs) + min(extra, max(2, 63 - max(needs)))
    host_choice = rng.random()
    if host_choice < 0.12:
        cfg["num_host_pages"] = 0
    elif host_choice < 0.2:
        cfg["num_host_pages"] = 1
    elif host_choice < 0.55:
        cfg["num_host_pages"] = rng.randint(2, max(3, max(needs) + 2))
    else:
        cfg["num_host_pages"] = 8 + 2 * sum(needs)

    if hybrid:
        _add_hybrid(rng, cfg, requests)

    delays = {}
    if rng.random() < 0.7:
        p = rng.choice([0.1, 0.3, 0.6])
        for s in range(150):
            if rng.random() < p:
                delays[s] = rng.randint(1, 6)
    script = {
        "version": SCRIPT_VERSION,
        "seed": seed,
        "hybrid": hybrid,
        "config": cfg,
        "requests": requests,
        "wb_delays": delays,
        "max_steps": 400,
    }
    problems = script_problems(script)
    assert not problems, (seed, problems)
    return script


def _add_hybrid(rng: random.Random, cfg: dict, requests: list[dict]) -> None:
    """Turns a plain config into a Mamba one or a paged-cache-group one."""
    page = cfg["page_size"]
    if rng.random() < 0.5:
        cfg["enable_mamba"] = True
        cfg["mamba_cache_chunk_size"] = page * rng.choice([1, 2, 4])
        bs = cfg["max_batch_size"]
        # Slot pools: every chunk and the first decode take a fresh checkpoint slot that
        # the tree keeps, so a pool small next to the prompts' chunk count stalls the
        # reference (slot exhaustion retracts; a request dropped by a failed retraction
        # does not give its slots back). Two slots (the least kvtier accepts) nearly
        # always stall: rare. Mostly a pool that fits the chunks, sometimes a tight one.
        per_req = cdiv(max(request_peak_tokens(cfg, r) for r in requests), cfg["mamba_cache_chunk_size"])
        cfg["mamba_pool_total_chunks"] = (2 if rng.random() < 0.05 else rng.choice(
            [rng.randint(3, 2 * bs + 2), 2 * bs + per_req + 2, 4 * bs + 2 * per_req + 8]))
        if l2_active(cfg) and rng.random() < 0.6:
            cfg["enable_mamba_l2"] = True
            # Roomy: when Mamba host slots must be evicted, the reference picks victims
            # differently in two Scheduler instances of one process (slots 4..8 made
            # ~1 script in 500 diverge from itself), so no script can compare there.
            cfg["mamba_l2_host_slots"] = rng.choice([64, len(requests) * per_req + 8])
        return
    peak = max(request_peak_tokens(cfg, r) for r in requests)
    budget = cfg["max_scheduled_tokens"]
    # With a prefix-cache adjunct, the required group's page must hold exactly one KV
    # page of tokens: a larger one (alignment a multiple of the page) makes the reference
    # double-free pages (glibc abort / SIGSEGV, seen with page 1 and an 8-token group
    # page), and a smaller one is refused by kvtier (snapshots off page boundaries).
    required = ["full"] if rng.random() < 0.6 else None
    if required:
        stride = rng.choice([s for s in (1, 2) if page % s == 0])
        rows = page // stride
    else:
        rows, stride = rng.choice([1, 2, 4]), rng.choice([1, 1, 2])
    full = {"group_id": "full", "rows_per_page": rows, "entry_stride_tokens": stride,
            "retention": "FullHistory", "sliding_window_tokens": None, "family": "History"}
    swa = {"group_id": "swa", "rows_per_page": rng.choice([2, 4]), "entry_stride_tokens": 1,
           "retention": "SlidingWindow", "sliding_window_tokens": rng.randint(2, 12),
           "family": rng.choice(["History", "State"])}
    groups = [full, swa] if rng.random() < 0.7 else [full]
    rng.shuffle(groups)
    for g in groups:
        need = group_pages_needed(g, peak, budget, g["group_id"] in (required or []))
        # A group pool short of pages stalls the reference (no retraction for group
        # pages): mostly room for several requests, sometimes for barely one.
        g["total_pages"] = 1 + need + rng.choice([0, need // 2, need, 2 * need, len(requests) * need])
    cfg["paged_cache_groups"] = groups
    cfg["prefix_cache_adjunct"] = required
    if required:
        # The reference's hybrid prefix cache with an adjunct and a host pool fails its own
        # checks ("HybridPrefixCache::OnNodeDestroyed: paged snapshot still has a
        # request-table borrower") or crashes (SIGSEGV in active_kv_pages() after a
        # retraction); DeepSeek-V4 runs it without a host tier, so these scripts do too.
        cfg["num_host_pages"] = rng.choice([0, 1])


# --------------------------------------------------------------------------------------
# Building API objects
# --------------------------------------------------------------------------------------

PLAIN_CONFIG_FIELDS = (
    "page_size", "max_scheduled_tokens", "max_batch_size", "decode_input_tokens",
    "num_device_pages", "num_host_pages", "disable_l2_cache", "enable_kv_cache_events",
    "enable_mixed_prefill_decode", "disable_prefix_cache", "enable_mamba",
    "mamba_cache_chunk_size", "mamba_pool_total_chunks", "enable_mamba_l2",
    "mamba_l2_host_slots", "overlap_schedule_depth",
)


def make_config(mod, cfg: dict):
    c = mod.SchedulerConfig()
    for key in PLAIN_CONFIG_FIELDS:
        if key in cfg:
            setattr(c, key, cfg[key])
    groups = cfg.get("paged_cache_groups") or []
    if groups:
        c.paged_cache_groups = [
            mod.PagedCacheGroupConfig(
                g["group_id"], g["rows_per_page"], g["entry_stride_tokens"], g["total_pages"],
                getattr(mod.PagedCacheRetention, g.get("retention", "FullHistory")),
                g.get("sliding_window_tokens"),
                getattr(mod.PagedCacheGroupFamily, g.get("family", "History")))
            for g in groups]
    if cfg.get("prefix_cache_adjunct"):
        adj = mod.PrefixCacheAdjunctSpec()
        adj.required_groups = list(cfg["prefix_cache_adjunct"])
        c.prefix_cache_adjunct = adj
    return c


def is_mamba_config(cfg: dict) -> bool:
    return bool(cfg.get("enable_mamba"))


def is_hybrid_config(cfg: dict) -> bool:
    return bool(cfg.get("enable_mamba") or cfg.get("paged_cache_groups"))


# --------------------------------------------------------------------------------------
# Snapshots: everything observable, as plain Python data with raw ids
# --------------------------------------------------------------------------------------

FORWARD_FIELDS = (
    "request_ids", "request_pool_indices", "input_lengths", "prefill_lengths",
    "occupied_pages", "begins", "sizes", "new_occupied_pages", "input_ids",
    "shifted_input_ids", "extend_prefix_lens", "decode_input_ids", "hist_token_lens",
)
MAMBA_FIELDS = (
    "mamba_pool_indices", "mamba_checkpoint_dst_indices", "mamba_track_pool_indices",
    "mamba_cow_src_indices", "mamba_branching_seqlens",
)


def snapshot_plan(plan, hybrid: bool) -> dict:
    forwards = []
    for fwd in plan.forward:
        f = {name: getattr(fwd, name) for name in FORWARD_FIELDS}
        f["num_extends"] = fwd.num_extends()
        if hybrid:
            for name in MAMBA_FIELDS:
                f[name] = getattr(fwd, name)
            f["paged_cache_block_tables"] = dict(fwd.paged_cache_block_tables)
            f["paged_cache_block_table_base_offsets"] = dict(fwd.paged_cache_block_table_base_offsets)
        forwards.append(f)
    cache = []
    for op in plan.cache:
        c = {"type": type(op).__name__}
        for name in ("op_ids", "src_pages", "dst_pages", "src_pages_by_kind", "dst_pages_by_kind", "is_retract"):
            if hasattr(op, name):
                value = getattr(op, name)
                c[name] = dict(value) if isinstance(value, dict) else value
        cache.append(c)
    return {"forward": forwards, "cache": cache}


def snapshot_kv_events(events) -> list[tuple]:
    out = []
    for e in events:
        out.append((e.kind, list(e.block_hashes), getattr(e, "parent_block_hash", None),
                    list(getattr(e, "token_ids", []) or []), getattr(e, "block_size", None)))
    return out


def _at(values, i):
    """values[i], or None when there is no such element (a malformed op compares unequal)."""
    return values[i] if values is not None and i < len(values) else None


def writeback_records(op: dict) -> list[dict]:
    """One record per op id of a flat WriteBackOp."""
    recs = []
    mamba_src = op.get("src_pages_by_kind", {}).get("mamba")
    mamba_dst = op.get("dst_pages_by_kind", {}).get("mamba")
    for i, op_id in enumerate(op["op_ids"]):
        recs.append({
            "op_id": op_id,
            "src": _at(op["src_pages"], i) or [], "dst": _at(op["dst_pages"], i) or [],
            "kv_src": _at(op.get("src_pages_by_kind", {}).get("kv"), i),
            "kv_dst": _at(op.get("dst_pages_by_kind", {}).get("kv"), i),
            "mamba_src": _at(mamba_src, i),
            "mamba_dst": _at(mamba_dst, i),
            "is_retract": _at(op.get("is_retract"), i),
        })
    return recs


def plan_writeback_records(snap: dict) -> list[dict]:
    """One record per op id of a plan's write-backs, in plan order."""
    return [rec for c in snap["cache"] if c["type"] == "WriteBackOp" for rec in writeback_records(c)]


# --------------------------------------------------------------------------------------
# Id mapping and comparison
# --------------------------------------------------------------------------------------

class Divergence(Exception):
    """The first observable difference between the two sides."""

    def __init__(self, step, phase, what, ref, ours, note=""):
        super().__init__(f"step {step} {phase}: {what}")
        self.step, self.phase, self.what = step, phase, what
        self.ref, self.ours, self.note = ref, ours, note

    def __reduce__(self):  # picklable (results cross a fork in --isolate mode)
        return (Divergence, (self.step, self.phase, self.what, self.ref, self.ours, self.note))

    def report(self) -> str:
        lines = [f"DIVERGENCE at step {self.step} ({self.phase}): {self.what}",
                 f"  reference: {self.ref!r}",
                 f"  ours:      {self.ours!r}"]
        if self.note:
            lines.append(f"  note: {self.note}")
        return "\n".join(lines)


class IdMap:
    """A one-to-one mapping reference id -> our id for one namespace, learned as ids
    appear; negative ids are sentinels and must be equal. Tracks exact equality too."""

    def __init__(self, name: str, mode: str):
        self.name, self.mode = name, mode
        self.fwd: dict[int, int] = {}
        self.bwd: dict[int, int] = {}
        self.pairs = 0
        self.unequal = 0
        self.first_unequal = None

    def pair(self, r: int, k: int) -> str | None:
        """Records that reference id `r` corresponds to our id `k`; returns a complaint
        when that contradicts earlier pairs (or the ids differ in exact mode)."""
        self.pairs += 1
        if r != k:
            self.unequal += 1
            if self.first_unequal is None:
                self.first_unequal = (r, k)
        if r < 0 or k < 0 or self.mode == "exact":
            return None if r == k else f"{self.name} id {r} != {k}"
        if self.mode == "any":
            return None
        known = self.fwd.get(r)
        if known is not None and known != k:
            return f"{self.name} id {r} was mapped to {known}, now to {k}"
        back = self.bwd.get(k)
        if back is not None and back != r:
            return f"{self.name} id {k} (ours) was mapped from {back}, now from {r}"
        self.fwd[r] = k
        self.bwd[k] = r
        return None

    def to_ref(self, k: int) -> int:
        """Our id translated to the reference's (unknown ids: a value no id has)."""
        if self.mode != "bijection" or k < 0:
            return k
        return self.bwd.get(k, -(10 ** 9) - k)


class Comparator:
    def __init__(self, id_modes: dict | None = None):
        self.modes = dict(ID_MODES, **(id_modes or {}))
        self.maps: dict[str, IdMap] = {}
        self.step, self.phase = 0, ""

    def idmap(self, ns: str) -> IdMap:
        m = self.maps.get(ns)
        if m is None:
            mode = self.modes.get(ns.split(":")[0], "bijection")
            m = self.maps[ns] = IdMap(ns, mode)
        return m

    def fail(self, what, ref, ours, note=""):
        raise Divergence(self.step, self.phase, what, ref, ours, note)

    def exact(self, what, ref, ours, note=""):
        if ref != ours:
            self.fail(what, ref, ours, note)

    def sizes(self, what, ref: dict, ours: dict):
        """Size queries, key by key (so that the report names the query)."""
        for key in ref:
            a, b = ref[key], ours.get(key)
            if isinstance(a, dict) and isinstance(b, dict):
                for k in sorted(set(a) | set(b)):
                    self.exact(f"{what}: {key}({k!r})", a.get(k), b.get(k))
            else:
                self.exact(f"{what}: {key}()", a, b)

    def ids(self, what, ns, ref, ours):
        """Compares (nested lists of) ids through the namespace's mapping."""
        m = self.idmap(ns)

        def walk(a, b):
            if isinstance(a, list) or isinstance(b, list):
                if not (isinstance(a, list) and isinstance(b, list)) or len(a) != len(b):
                    return "shape differs"
                for x, y in zip(a, b):
                    err = walk(x, y)
                    if err:
                        return err
                return None
            if not isinstance(a, int) or not isinstance(b, int):
                return None if a == b else "value differs"
            return m.pair(a, b)

        err = walk(ref, ours)
        if err:
            self.fail(what, ref, ours, err)

    def to_ref(self, ns, ids):
        m = self.idmap(ns)
        return [m.to_ref(i) for i in ids]

    # -- the plan ------------------------------------------------------------------

    def compare_plan(self, ref: dict, ours: dict, hybrid: bool):
        self.exact("len(plan.forward)", len(ref["forward"]), len(ours["forward"]))
        for n, (a, b) in enumerate(zip(ref["forward"], ours["forward"])):
            p = f"forward[{n}]."
            self.exact(p + "request_ids", a["request_ids"], b["request_ids"])
            self.exact(p + "num_extends()", a["num_extends"], b["num_extends"])
            self.ids(p + "request_pool_indices", "pool", a["request_pool_indices"], b["request_pool_indices"])
            for name in ("input_lengths", "prefill_lengths", "begins", "sizes", "extend_prefix_lens",
                         "input_ids", "shifted_input_ids", "decode_input_ids", "hist_token_lens"):
                self.exact(p + name, a[name], b[name])
            self.ids(p + "occupied_pages", "device", a["occupied_pages"], b["occupied_pages"])
            self.ids(p + "new_occupied_pages", "device", a["new_occupied_pages"], b["new_occupied_pages"])
            if hybrid:
                for name in MAMBA_FIELDS:
                    if name == "mamba_branching_seqlens":
                        self.exact(p + name, a[name], b[name])
                    else:
                        self.ids(p + name, "mamba", a[name], b[name])
                ta, tb = a["paged_cache_block_tables"], b["paged_cache_block_tables"]
                self.exact(p + "paged_cache_block_tables.keys()", sorted(ta), sorted(tb))
                for g in sorted(ta):
                    self.ids(p + f"paged_cache_block_tables[{g!r}]", "group:" + g, ta[g], tb[g])
                self.exact(p + "paged_cache_block_table_base_offsets",
                           a["paged_cache_block_table_base_offsets"], b["paged_cache_block_table_base_offsets"])
        self.exact("plan.cache types", [c["type"] for c in ref["cache"]], [c["type"] for c in ours["cache"]])
        for a, b in zip(ref["cache"], ours["cache"]):
            if a["type"] == "WriteBackOp":
                self.compare_writebacks(a, b)
            elif a["type"] == "LoadBackOp":
                self.compare_loadbacks(a, b)
            else:
                self.exact(f"plan.cache {a['type']}", a, b)

    def writeback_order(self, op: dict, translate: bool) -> list[dict]:
        """The op's records in canonical order: by (is_retract, source pages) in the
        reference's page ids (ours translated through the bijections)."""
        recs = writeback_records(op)

        def key(r):
            src = r["src"]
            msrc = r["mamba_src"] or []
            if translate:
                src = self.to_ref("device", src)
                msrc = self.to_ref("mamba", msrc)
            return (bool(r["is_retract"]), list(src), list(msrc), len(r["dst"]))
        return sorted(recs, key=key)

    def ack_order(self, ref_op: dict, ours_op: dict) -> tuple[list[int], list[int]]:
        """The order both sides acknowledge a plan's write-backs in: ours in op-id order
        (kvtier's, by request id; an op sharing a prefix with an earlier op of its plan
        is resolved after it, so acknowledging in op order applies each ack as it comes),
        and the reference's matching ops in the same order, matched by their source
        pages. (The reference's own op order follows an unordered_map.)"""
        ref_recs = writeback_records(ref_op)
        ours_recs = sorted(writeback_records(ours_op), key=lambda r: r["op_id"])
        ref_order = []
        for rec in ours_recs:
            key = (bool(rec["is_retract"]), list(self.to_ref("device", rec["src"])))
            match = next((r for r in ref_recs if (bool(r["is_retract"]), list(r["src"])) == key), None)
            if match is None:  # the plans already differ; compare_writebacks said so
                return ([r["op_id"] for r in self.writeback_order(ref_op, translate=False)],
                        [r["op_id"] for r in self.writeback_order(ours_op, translate=True)])
            ref_recs.remove(match)
            ref_order.append(match["op_id"])
        return ref_order + [r["op_id"] for r in ref_recs], [r["op_id"] for r in ours_recs]

    def compare_writebacks(self, a: dict, b: dict):
        # The reference orders finish write-backs by unordered_map iteration: compare
        # the ops as a multiset keyed by their source pages.
        self.exact("WriteBackOp.len(op_ids)", len(a["op_ids"]), len(b["op_ids"]))
        self.exact("WriteBackOp.src_pages_by_kind.keys()", sorted(a.get("src_pages_by_kind", {})),
                   sorted(b.get("src_pages_by_kind", {})))
        self.exact("WriteBackOp.dst_pages_by_kind.keys()", sorted(a.get("dst_pages_by_kind", {})),
                   sorted(b.get("dst_pages_by_kind", {})))
        ra = self.writeback_order(a, translate=False)
        rb = self.writeback_order(b, translate=True)
        for x, y in zip(ra, rb):
            what = "WriteBackOp (as a multiset, sorted by source pages)"
            if x["is_retract"] != y["is_retract"]:
                self.fail(what + ".is_retract", ra, rb)
            self.ids(what + ".src_pages", "device", x["src"], y["src"])
            self.ids(what + ".dst_pages", "host", x["dst"], y["dst"])
            self.ids(what + ".src_pages_by_kind['kv']", "device", x["kv_src"], y["kv_src"])
            self.ids(what + ".dst_pages_by_kind['kv']", "host", x["kv_dst"], y["kv_dst"])
            self.ids(what + ".src_pages_by_kind['mamba']", "mamba", x["mamba_src"], y["mamba_src"])
            self.ids(what + ".dst_pages_by_kind['mamba']", "mamba_host", x["mamba_dst"], y["mamba_dst"])
            self.ids(what + ".op_ids", "op", x["op_id"], y["op_id"])

    def compare_loadbacks(self, a: dict, b: dict):
        self.ids("LoadBackOp.op_ids", "op", a["op_ids"], b["op_ids"])
        self.ids("LoadBackOp.src_pages", "host", a["src_pages"], b["src_pages"])
        self.ids("LoadBackOp.dst_pages", "device", a["dst_pages"], b["dst_pages"])
        for side in ("src", "dst"):
            ka, kb = a.get(side + "_pages_by_kind", {}), b.get(side + "_pages_by_kind", {})
            self.exact(f"LoadBackOp.{side}_pages_by_kind.keys()", sorted(ka), sorted(kb))
            for kind in sorted(ka):
                if kind == "kv":
                    ns = "host" if side == "src" else "device"
                elif kind == "mamba":
                    ns = "mamba_host" if side == "src" else "mamba"
                else:
                    ns = kind
                self.ids(f"LoadBackOp.{side}_pages_by_kind[{kind!r}]", ns, ka[kind], kb[kind])

    def compare_kv_events(self, ref: list, ours: list):
        # The removals of one drain compare as a multiset (docs/python.md, difference
        # "removal order"): which nodes an ack or an eviction releases is compared, not
        # the order the two trees walk them in. Stores keep their order (a parent's
        # BlockStored comes before its child's).
        def canonical(events):
            stored = [e for e in events if e[0] != "BlockRemoved"]
            removed = sorted((e for e in events if e[0] == "BlockRemoved"), key=repr)
            return stored + removed

        if canonical(ref) != canonical(ours):
            same_multiset = collections.Counter(map(repr, ref)) == collections.Counter(map(repr, ours))
            first = next((i for i, (x, y) in enumerate(zip(ref, ours)) if x != y), min(len(ref), len(ours)))
            self.fail("drain_kv_events()", ref, ours,
                      f"first difference at index {first}; "
                      + ("same multiset, different order" if same_multiset else "different multisets"))


# --------------------------------------------------------------------------------------
# Drivers
# --------------------------------------------------------------------------------------

# Exceptions that end the harness rather than count as a module's answer. Everything
# else is caught, BaseException included: a Rust panic arrives as PyO3's PanicException,
# which derives from BaseException.
_FATAL = (KeyboardInterrupt, SystemExit, GeneratorExit)


def _call(fn, *args):
    """(result, exception) of a call."""
    try:
        return fn(*args), None
    except _FATAL:
        raise
    except BaseException as e:  # noqa: BLE001 - any exception is an observation
        return None, e


class StateTracker:
    """The depth (in tokens) of the recurrent state each Mamba slot holds, as an engine
    that follows the plans would leave it: a row's working slot holds the state after
    the tokens it computed, its checkpoint the state where the worker's rule copies it
    (`kvtier_mamba::checkpoint_depth`; on a decode, a page-aligned new length), and copy
    ops move states between the tiers. A decode row, speculative or not, leaves the
    state after the tokens the engine accepted: the driver answers each with one token,
    so its working slot (and its checkpoint, where that ends a page) holds the state
    after one more token. A row that starts from a slot at another depth than its
    history (a copy-on-write source, or its own working slot) computes on a wrong
    state: `apply` returns those rows' request ids. None: a slot whose content is wrong
    (or never written)."""

    ACCEPTED = 1  # tokens the driver's answer to a decode row accepts

    def __init__(self, cfg: dict):
        self.page = cfg["page_size"]
        self.chunk = cfg.get("mamba_cache_chunk_size") or 1
        self.device: dict[int, int | None] = {}
        self.host: dict[int, int | None] = {}

    def _checkpoint(self, begin: int, size: int) -> int | None:
        end, p = begin + size, self.page
        last = end // p * p
        if size <= 0 or last <= begin:
            return None
        if last == end:
            return end
        return last if (last - begin) % self.chunk == 0 else None

    def apply(self, snap: dict) -> list[str]:
        """Applies one plan; the requests whose rows read a wrong state."""
        for c in snap["cache"]:
            src = (c.get("src_pages_by_kind") or {}).get("mamba") or []
            dst = (c.get("dst_pages_by_kind") or {}).get("mamba") or []
            to_host = c["type"] == "WriteBackOp"
            if c["type"] not in ("WriteBackOp", "LoadBackOp"):
                continue
            for s_list, d_list in zip(src, dst):
                for a, b in zip(s_list or [], d_list or []):
                    if to_host:
                        self.host[b] = self.device.get(a)
                    else:
                        self.device[b] = self.host.get(a)
        wrong = []
        for f in snap["forward"]:
            n_ext = f["num_extends"]
            hist = f.get("hist_token_lens") or []
            for i, rid in enumerate(f["request_ids"]):
                w = f["mamba_pool_indices"][i]
                if w < 0:
                    continue
                ckpt = f["mamba_checkpoint_dst_indices"][i]
                src = f["mamba_cow_src_indices"][i]
                size = f["input_lengths"][i]
                decode_hist = hist[i - n_ext] if i >= n_ext and i - n_ext < len(hist) else -1
                if i < n_ext:
                    begin = f["extend_prefix_lens"][i]
                elif src >= 0 or decode_hist >= 0:
                    begin = decode_hist
                else:
                    begin = self.device.get(w)
                if src >= 0:
                    start = self.device.get(src)
                elif i < n_ext and begin == 0:
                    start = 0  # a fresh state
                else:
                    start = self.device.get(w)
                ok = begin is not None and start == begin
                if not ok:
                    wrong.append(rid)
                    end = at = None
                elif i < n_ext:
                    end, at = begin + size, self._checkpoint(begin, size)
                else:
                    end = begin + self.ACCEPTED
                    at = end if end % self.page == 0 else None
                self.device[w] = end
                if ckpt >= 0:
                    self.device[ckpt] = at
        return wrong


class Side:
    """One module's scheduler and the driver that feeds it events from its own plans."""

    def __init__(self, name: str, module, script: dict):
        self.name, self.mod, self.script = name, module, script
        self.cfg = script["config"]
        self.sched = module.Scheduler(make_config(module, self.cfg))
        self.reqs = {r["id"]: r for r in script["requests"]}
        self.arrivals = collections.defaultdict(list)
        for r in script["requests"]:
            self.arrivals[r["arrive"]].append(r["id"])
        self.submitted: list[str] = []
        self.closed: set[str] = set()  # Finish or Abort sent
        self.generated = collections.Counter()
        self.decode_rows = collections.Counter()
        self.pending_acks: list[tuple] = []  # (due step, issue step, index, op id)
        self.group_ids = [g["group_id"] for g in self.cfg.get("paged_cache_groups") or []]
        self.log: list[tuple] = []  # (step, events sent) for reports
        # Write-back pairs of ops not acknowledged yet: op id -> set of (src, dst).
        self.unacked_pairs: dict[int, set] = {}
        # Device state slots those ops copy from: op id -> set of slots.
        self.unacked_mamba_src: dict[int, set] = {}
        # This step's acknowledgements as (op id, the step its op was issued at), and the
        # steps at which an Abort was sent: for the known-difference checks.
        self.acked_now: list[tuple[int, int]] = []
        self.abort_during_copy = False
        # Each request's paged-group pages as of its last row: group id -> page ids.
        self.group_pages: dict[str, dict[str, set[int]]] = {}
        self.abort_steps: list[int] = []
        # The states its Mamba slots hold, and the step at which a row of its last
        # read a wrong one.
        self.states = StateTracker(self.cfg)
        self.read_wrong_state_at: int | None = None
        # Its plans in a row, up to the current one, that had nothing to run or copy,
        # with no arrival or event since the first: it sits at a fixed point.
        self.idle_plans = 0

    def submit(self, step: int):
        rids = self.arrivals.get(step, [])
        if not rids:
            return None
        specs = []
        for rid in rids:
            spec = self.mod.RequestSpec()
            spec.request_id = rid
            spec.tokens = list(self.reqs[rid]["prompt"])
            specs.append(spec)
        self.submitted.extend(rids)
        _, exc = _call(self.sched.submit_requests, specs)
        return exc

    def sizes(self) -> dict:
        s = self.sched
        out = {
            "waiting_size": s.waiting_size(), "prefilling_size": s.prefilling_size(),
            "decoding_size": s.decoding_size(), "retract_count": s.retract_count(),
            "available_kv_pages": s.available_kv_pages(), "active_kv_pages": s.active_kv_pages(),
            "get_request_token_size": {rid: s.get_request_token_size(rid) for rid in self.submitted},
        }
        if self.group_ids:
            out["paged_cache_group_available_pages"] = {g: s.paged_cache_group_available_pages(g) for g in self.group_ids}
            out["paged_cache_group_failed_alloc_count"] = {
                g: s.paged_cache_group_failed_alloc_count(g) for g in self.group_ids}
        return out

    def build_event(self, step: int, snap: dict, wb_order: list[int]):
        """The ExecutionEvent answering plan `snap`, and a log of its contents."""
        mod = self.mod
        ev = mod.ExecutionEvent()
        log = []
        delay = self.script.get("wb_delays", {}).get(step, 0)
        for i, op_id in enumerate(wb_order):
            self.pending_acks.append((step + delay, step, i, op_id))
        # Acks due now, oldest plan first, each plan's ops in the agreed order.
        due = sorted((a for a in self.pending_acks if a[0] <= step), key=lambda a: (a[1], a[2]))
        self.pending_acks = [a for a in self.pending_acks if a[0] > step]
        self.acked_now = [(op_id, issued) for _, issued, _, op_id in due]
        for _, _, _, op_id in due:
            self.unacked_pairs.pop(op_id, None)
            self.unacked_mamba_src.pop(op_id, None)
            d = mod.Cache.WriteBackDoneEvent()
            d.op_id = op_id
            d.success = True
            ev.add_event(d)
            log.append(("WriteBackDone", op_id))
        for fwd in snap["forward"]:
            n_ext = fwd["num_extends"]
            for i, rid in enumerate(fwd["request_ids"]):
                if rid in self.closed:
                    continue
                if i < n_ext and fwd["extend_prefix_lens"][i] + fwd["input_lengths"][i] != fwd["prefill_lengths"][i]:
                    continue  # a chunk that does not finish the prompt: no result
                tok = gen_token(rid, self.generated[rid])
                r = mod.ForwardEvent.ExtendResult()
                r.request_id = rid
                r.tokens = [tok]
                ev.add_event(r)
                log.append(("ExtendResult", rid, tok))
                self.generated[rid] += 1
                if self.generated[rid] >= self.reqs[rid]["gen"]:
                    f = mod.ForwardEvent.Finish()
                    f.request_id = rid
                    ev.add_event(f)
                    log.append(("Finish", rid))
                    self.closed.add(rid)
                elif i >= n_ext:
                    self.decode_rows[rid] += 1
                    value = self.reqs[rid].get("reserve", {}).get(self.decode_rows[rid])
                    if value is not None:
                        u = mod.ForwardEvent.UpdateReserveNumTokens()
                        u.request_id = rid
                        u.reserve_num_tokens_in_next_schedule_event = value
                        ev.add_event(u)
                        log.append(("UpdateReserveNumTokens", rid, value))
        for rid in self.submitted:
            r = self.reqs[rid]
            if r.get("abort_at") == step and rid not in self.closed:
                a = mod.ForwardEvent.Abort()
                a.request_id = rid
                ev.add_event(a)
                log.append(("Abort", rid))
                self.abort_steps.append(step)
                # An abort while a write-back is unacknowledged (it may be the aborted
                # request's): the reference lets go of the copy's pages at once and drops
                # the late acknowledgement; kvtier keeps them pinned until it comes, so
                # the caches may differ from here on (known difference "abort-during-copy").
                if self.pending_acks:
                    self.abort_during_copy = True
                self.closed.add(rid)
        self.log.append((step, log))
        return ev, log

    def all_arrived(self, step: int) -> bool:
        return all(r["arrive"] <= step for r in self.script["requests"])


# --------------------------------------------------------------------------------------
# Running a script
# --------------------------------------------------------------------------------------

STAT_KEYS = ("steps", "plans_with_rows", "chunked_rows", "prefix_hit_rows", "mixed_plans",
             "retract_plans", "retract_writebacks", "writeback_plans", "writeback_ops",
             "loadback_plans", "loadback_ops", "block_stored", "block_removed_events",
             "block_removed_hashes", "aborts", "finishes", "reserve_updates", "delayed_acks",
             "dropped_by_scheduler", "reference_exceptions")


class RunResult:
    def __init__(self, script):
        self.script = script
        self.divergence: Divergence | None = None
        self.stats = collections.Counter({k: 0 for k in STAT_KEYS})
        self.flags: set[str] = set()  # features this script exercised
        self.idle = False
        self.stalled = False
        self.exceptions: list[str] = []  # exceptions both sides raised alike
        self.id_maps: dict[str, IdMap] = {}
        self.context: list[str] = []
        self.crashed: str | None = None  # set by run_isolated when the process died
        self.known: str | None = None  # the known difference the divergence is, if any

    @property
    def exact_ids(self) -> bool:
        return all(m.unequal == 0 for m in self.id_maps.values())


def _compare_exc(comp: Comparator, what: str, e_ref, e_ours, result: RunResult):
    if (e_ref is None) != (e_ours is None) or (e_ref is not None and type(e_ref).__name__ != type(e_ours).__name__):
        comp.fail(f"exception from {what}",
                  None if e_ref is None else f"{type(e_ref).__name__}: {e_ref}",
                  None if e_ours is None else f"{type(e_ours).__name__}: {e_ours}")
    if e_ref is not None:
        result.stats["reference_exceptions"] += 1
        result.exceptions.append(f"step {comp.step} {what}: {type(e_ref).__name__}: {e_ref}")


def _account(result: RunResult, snap: dict, seen_prefill: set, events_after: list):
    st = result.stats
    for fwd in snap["forward"]:
        rows = fwd["request_ids"]
        n_ext = fwd["num_extends"]
        if rows:
            st["plans_with_rows"] += 1
        if 0 < n_ext < len(rows):
            st["mixed_plans"] += 1
        for i in range(n_ext):
            rid = rows[i]
            if fwd["extend_prefix_lens"][i] + fwd["input_lengths"][i] != fwd["prefill_lengths"][i]:
                st["chunked_rows"] += 1
            if rid not in seen_prefill:
                seen_prefill.add(rid)
                if fwd["extend_prefix_lens"][i] > 0:
                    st["prefix_hit_rows"] += 1
                    result.flags.add("prefix_hit")
    for c in snap["cache"]:
        if c["type"] == "WriteBackOp":
            st["writeback_plans"] += 1
            st["writeback_ops"] += len(c["op_ids"])
            result.flags.add("writeback")
            n_retract = sum(1 for x in c.get("is_retract", []) if x)
            if n_retract:
                st["retract_plans"] += 1
                st["retract_writebacks"] += n_retract
                result.flags.add("retract_writeback")
        elif c["type"] == "LoadBackOp":
            st["loadback_plans"] += 1
            st["loadback_ops"] += len(c["op_ids"])
            result.flags.add("loadback")
    for e in events_after:
        if e[0] == "BlockStored":
            st["block_stored"] += 1
        elif e[0] == "BlockRemoved":
            st["block_removed_events"] += 1
            st["block_removed_hashes"] += len(e[1])
            result.flags.add("evict")


def trace_line(step: int, snap: dict, log: list, sizes: dict, kv: list) -> str:
    """One step of the reference side, for --trace."""
    out = [f"step {step}:"]
    for f in snap["forward"]:
        if f["request_ids"]:
            out.append(f"  rows {f['request_ids']} ext={f['num_extends']} in={f['input_lengths']} "
                       f"prefix={f['extend_prefix_lens']} prefill={f['prefill_lengths']} "
                       f"pages={f['occupied_pages']}")
    for c in snap["cache"]:
        out.append(f"  {c['type']} ops={c['op_ids']} src={c['src_pages']} dst={c['dst_pages']}"
                   + (f" retract={c['is_retract']}" if "is_retract" in c else ""))
    if log:
        out.append(f"  events {log}")
    if kv:
        out.append("  kv " + " ".join(f"{e[0]}x{len(e[1])}" for e in kv))
    out.append("  sizes " + " ".join(f"{k}={v}" for k, v in sizes.items() if k != "get_request_token_size")
               + f" live={ {k: v for k, v in sizes['get_request_token_size'].items() if v >= 0} }")
    return "\n".join(out)


def _read_ours(comp: Comparator, what: str, fn):
    """fn() on our side; an exception there (a missing attribute, a wrong type) is a
    divergence. The reference side is read directly: an exception there is a harness bug
    and propagates."""
    try:
        return fn()
    except _FATAL:
        raise
    except BaseException as e:  # noqa: BLE001
        comp.fail(f"exception from {what}", None, f"{type(e).__name__}: {e}")


WRONG_STATE_OURS = "rows computing on a recurrent state of another depth than their history (ours)"


def run_script(script: dict, ref_module, kv_module, id_modes: dict | None = None,
               stall_limit: int = 40, trace=None, classify: bool = True) -> RunResult:
    """Drives both modules through `script`; stops at the first divergence.

    Returns a RunResult; `result.divergence` is None when the two agreed throughout.
    `id_modes` overrides ID_MODES per namespace (e.g. {"pool": "bijection"}).
    `classify` False leaves a divergence unclassified (`result.known` None).
    """
    result = RunResult(script)
    comp = Comparator(id_modes)
    result.id_maps = comp.maps
    hybrid = is_hybrid_config(script["config"])
    current_ref = current_ours = None  # the last plans, for classifying a divergence
    ref = ours = None
    try:
        comp.phase = "construct"
        ref, e_ref = _call(Side, "reference", ref_module, script)
        ours, e_ours = _call(Side, "ours", kv_module, script)
        _compare_exc(comp, "Scheduler(config)", e_ref, e_ours, result)
        if e_ref is not None:
            return result
        seen_prefill: set[str] = set()
        dropped: set[str] = set()
        quiet = 0
        for step in range(script.get("max_steps", 400)):
            comp.step = step
            result.stats["steps"] += 1
            comp.phase = "submit"
            if ref.arrivals.get(step):
                ref.idle_plans = 0
            _compare_exc(comp, "submit_requests", ref.submit(step), ours.submit(step), result)

            comp.phase = "next_execution_plan"
            p_ref, e_ref = _call(ref.sched.next_execution_plan)
            p_ours, e_ours = _call(ours.sched.next_execution_plan)
            _compare_exc(comp, "next_execution_plan()", e_ref, e_ours, result)
            if e_ref is not None:
                return result
            s_ref = snapshot_plan(p_ref, hybrid)
            s_ours = _read_ours(comp, "reading the plan", lambda: snapshot_plan(p_ours, hybrid))
            current_ref, current_ours = s_ref, s_ours
            if hybrid and is_mamba_config(script["config"]):
                if ref.states.apply(s_ref):
                    ref.read_wrong_state_at = step
                wrong = ours.states.apply(s_ours)
                if wrong:
                    ours.read_wrong_state_at = step
                    raise Divergence(step, comp.phase, WRONG_STATE_OURS, [], wrong)
            comp.compare_plan(s_ref, s_ours, hybrid)
            for side, snap in ((ref, s_ref), (ours, s_ours)):
                if hybrid:
                    for f in snap["forward"]:
                        for i, rid in enumerate(f["request_ids"]):
                            side.group_pages[rid] = _row_group_pages(f, i)
                for rec in plan_writeback_records(snap):
                    side.unacked_pairs[rec["op_id"]] = set(zip(rec["src"], rec["dst"]))
                    side.unacked_mamba_src[rec["op_id"]] = set(rec["mamba_src"] or [])
            k_ref = snapshot_kv_events(ref.sched.drain_kv_events())
            k_ours = _read_ours(comp, "drain_kv_events()",
                                lambda: snapshot_kv_events(ours.sched.drain_kv_events()))
            comp.compare_kv_events(k_ref, k_ours)
            z_ref = ref.sizes()
            comp.sizes("after next_execution_plan()", z_ref, _read_ours(comp, "a size query", ours.sizes))

            comp.phase = "advance"
            wb_ref, wb_ours = [], []
            for a, b in zip(s_ref["cache"], s_ours["cache"]):
                if a["type"] == "WriteBackOp":
                    ref_order, ours_order = comp.ack_order(a, b)
                    wb_ref += ref_order
                    wb_ours += ours_order
            ev_ref, log_ref = ref.build_event(step, s_ref, wb_ref)
            ev_ours, _ = _read_ours(comp, "building the event", lambda: ours.build_event(step, s_ours, wb_ours))
            result.stats["delayed_acks"] += sum(1 for a in ref.pending_acks if a[1] == step)
            result.stats["aborts"] += sum(1 for e in log_ref if e[0] == "Abort")
            result.stats["finishes"] += sum(1 for e in log_ref if e[0] == "Finish")
            result.stats["reserve_updates"] += sum(1 for e in log_ref if e[0] == "UpdateReserveNumTokens")
            if any(e[0] == "Abort" for e in log_ref):
                result.flags.add("abort")
            ref_idle = not any(f["request_ids"] for f in s_ref["forward"]) and not s_ref["cache"]
            ref.idle_plans = ref.idle_plans + 1 if ref_idle and not log_ref else 0
            _, e_ref = _call(ref.sched.advance, ev_ref)
            _, e_ours = _call(ours.sched.advance, ev_ours)
            _compare_exc(comp, "advance()", e_ref, e_ours, result)
            k2_ref = snapshot_kv_events(ref.sched.drain_kv_events())
            k2_ours = _read_ours(comp, "drain_kv_events()",
                                 lambda: snapshot_kv_events(ours.sched.drain_kv_events()))
            comp.compare_kv_events(k2_ref, k2_ours)
            z2_ref = ref.sizes()
            comp.sizes("after advance()", z2_ref, _read_ours(comp, "a size query", ours.sizes))
            _account(result, s_ref, seen_prefill, k_ref + k2_ref)
            if z_ref["retract_count"] or z2_ref["retract_count"]:
                result.flags.add("retract")  # with or without a write-back
            # Requests the scheduler dropped on its own (the reference aborts a request
            # whose retraction finds no host room): gone although never finished by us.
            for rid, size in z2_ref["get_request_token_size"].items():
                if size < 0 and rid not in ref.closed and rid not in dropped:
                    dropped.add(rid)
                    result.stats["dropped_by_scheduler"] += 1
                    result.flags.add("dropped")
            if trace is not None:
                trace(trace_line(step, s_ref, log_ref, z2_ref, k_ref + k2_ref))

            # Idle: everything arrived, nothing queued or running, no op outstanding.
            busy = (z2_ref["waiting_size"] + z2_ref["prefilling_size"] + z2_ref["decoding_size"]
                    + z2_ref["retract_count"])
            no_work = not any(f["request_ids"] for f in s_ref["forward"]) and not s_ref["cache"]
            if ref.all_arrived(step) and busy == 0 and no_work and not ref.pending_acks:
                result.idle = True
                break
            # Stalled: no progress for a while with nothing pending to unblock it.
            abort_due = any(r.get("abort_at") is not None and r["abort_at"] > step and r["id"] not in ref.closed
                            for r in script["requests"])
            if (no_work and not log_ref and not ref.pending_acks and ref.all_arrived(step)
                    and not k_ref + k2_ref and not abort_due):
                quiet += 1
                if quiet >= stall_limit:
                    result.stalled = True
                    break
            else:
                quiet = 0
    except Divergence as d:
        result.divergence = d
        if ref is not None and ours is not None and classify:
            result.context = [f"reference events at step {s}: {events}" for s, events in ref.log[-3:]]
            result.known = classify_divergence(d, ref, ours, current_ref, current_ours, comp)
        elif d.phase == "construct" and _refused_transport_only_groups(script["config"], d):
            result.known = "transport-only-groups"
    return result


# --------------------------------------------------------------------------------------
# Known differences: reference bugs kvtier fixes on purpose (docs/python.md)
# --------------------------------------------------------------------------------------

KNOWN_DIFFERENCES = {
    "reference-stall": (
        "the reference deadlocks with retracted requests it can never resume (its recovery "
        "asks ceil(tokens/page) fresh pages, ignoring tail slack, and retracted requests "
        "keep their tail pages); kvtier's deadlock breaker requeues one to recompute. Or it "
        "sits idle for good with waiting requests and nothing running: a hybrid request "
        "it dropped after retracting it kept a slot the waiting ones need"
    ),
    "abort-during-copy": (
        "a request aborted while its write-back is in flight: the reference lets go of the "
        "copy's pins at once (its host pages can be evicted and reused while the engine still "
        "writes them) and drops the late acknowledgement, so the copy stays pending for good; "
        "kvtier's op table keeps the copy pinned until it is acknowledged, then completes it"
    ),
    "transport-only-groups": (
        "paged-cache groups without a required history group (no prefix-cache adjunct): "
        "the reference serves them as transport-only tables, kvtier refuses the config "
        "with a ValueError (docs/python.md)"
    ),
    "wrong-state-read": (
        "the reference runs a row on a recurrent state of another depth than the row's "
        "history: a checkpoint its worker never wrote, cached by a request that stopped "
        "(C.3 in docs/notes/mamba-reference.md), or a retracted request's recovery source "
        "shallower than its tokens (C.6); kvtier reuses a state only at exactly that "
        "depth, so it computes that row otherwise (or later)"
    ),
    "early-table-release": (
        "a paged model's finished or given-up request: kvtier frees its group pages at once, "
        "the reference when it forgets the request at its next plan; the free counts differ "
        "until then"
    ),
    "forget-order": (
        "paged-model requests that stopped in the same step give their group pages back when "
        "the next plan forgets them: the reference in its hash map's iteration order (an "
        "unordered_map keyed by request id), kvtier in id order; the next tables take the "
        "same number of pages with other ids"
    ),
    "slot-reused-under-copy": (
        "the reference hands a row a Mamba device slot that a write-back not yet "
        "acknowledged (of an earlier plan or of the same one) still copies to host: a state "
        "published again where one was cached frees the old slot at once (C.10 in "
        "docs/notes/mamba-reference.md), so the row writes it while the copy reads it; "
        "kvtier frees it at the acknowledgement (so its row takes another slot, or waits)"
    ),
    "stale-load-back": (
        "a hybrid request loads a prefix back (its first chunk or its recovery): the "
        "reference lists the pages to copy before it makes room, and the room evicts device "
        "copies on the request's own path past the node it locked (its match capped at the "
        "deepest device state); it then gives those nodes device pages again without "
        "copying them, so the row reads KV never written; kvtier copies every page it "
        "attaches"
    ),
    "host-state-eviction-ties": (
        "a write-back needs host Mamba slots and evicts host states for them: the reference "
        "sorts its candidates by last access time alone (an unstable sort over a hash set "
        "of node addresses), and the states one match touched tie, so which of them go "
        "depends on where its nodes lie in memory (the same script evicts others from run "
        "to run); kvtier breaks the tie by node age. Recognised by running the reference "
        "again on the script in fresh processes with its heap laid out otherwise: it makes "
        "kvtier's plan there, or its own choice changes and kvtier's slots are among those "
        "it draws"
    ),
    "pending-copy": (
        "a finishing request whose prefix is still being written back by an earlier op: the "
        "reference writes nothing (it ignores failed copies), kvtier copies those pages in the "
        "request's own op, or gives it an op of its own that relies on the earlier one, so a "
        "failed copy never leaves host pages read as written"
    ),
}


# Known differences where the reference's side depends on its heap layout (in some
# runs it makes kvtier's plan).
HEAP_DEPENDENT = {"host-state-eviction-ties"}


def _new_divergence(result) -> bool:
    return result.divergence is not None and result.known is None


def classify_divergence(d, ref, ours, current_ref, current_ours, comp) -> str | None:
    """The known difference `d` is an instance of, or None. Each check recognises the
    situation itself (not the divergence's wording), so a new bug that happens to show
    at the same field is not excused. A check that drives the sides on runs on a copy
    of them, so each check starts where the script left them."""
    if current_ours is not None and _rewrites_pending_copy(ours, current_ours):
        return "pending-copy"
    if _on_a_copy(_released_tables_earlier, d, ref, ours, current_ref, current_ours):
        return "early-table-release"
    if _forgotten_together(d, ref, ours):
        return "forget-order"
    if current_ref is not None and current_ours is not None and _reuses_slot_under_copy(
            d, ref, ours, current_ref, current_ours):
        return "slot-reused-under-copy"
    if current_ref is not None and current_ours is not None and _same_copies_split_otherwise(
            current_ref, current_ours, comp):
        return "pending-copy"
    if current_ref is not None and current_ours is not None and _on_a_copy(
            _loads_back_less_than_it_evicted, d, ref, ours, current_ref, current_ours):
        return "stale-load-back"
    if ref.read_wrong_state_at == d.step and ours.read_wrong_state_at is None:
        return "wrong-state-read"
    counts = d.what.startswith("after") and ("retract_count" in d.what or "waiting_size" in d.what)
    if (counts and is_mamba_config(ref.cfg) and ours.read_wrong_state_at is None
            and _on_a_copy(_reference_reads_wrong_state, ref, d.step, d.phase, current_ref)):
        return "wrong-state-read"
    if ref.abort_during_copy:
        return "abort-during-copy"
    if _on_a_copy(_reference_stalls, ref, d.step, d.phase, current_ref):
        return "reference-stall"
    if _reference_ties_host_states(d, ref, ours):
        return "host-state-eviction-ties"
    return None


def _on_a_copy(check, *args) -> bool:
    """`check(*args)` in a forked child, a copy of this process: the sides it drives on
    stay as they are here. Where there is no fork, in this process."""
    if not hasattr(os, "fork"):
        return check(*args)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            passed = check(*args)
        except BaseException:  # noqa: BLE001 (a Rust panic is a BaseException)
            passed = False
        os._exit(0 if passed else 1)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _rewrites_pending_copy(ours, snap) -> bool:
    """Our plan has a write-back with no pages of its own, or one that copies again a
    pair an earlier, unacknowledged op of ours copies."""
    records = plan_writeback_records(snap)
    if any(not rec["src"] and not rec.get("mamba_src") for rec in records):
        return True
    this_plan = {rec["op_id"] for rec in records}
    in_flight = set()
    for op_id, pairs in ours.unacked_pairs.items():
        if op_id not in this_plan:
            in_flight |= pairs
    return any(set(zip(rec["src"], rec["dst"])) & in_flight for rec in records)


def _reuses_slot_under_copy(d, ref, ours, snap_ref, snap_ours) -> bool:
    """This plan differs, and a row of the reference's plan writes a device slot that
    one of its unacknowledged write-backs copies from (one of an earlier plan, or of
    this one: a copy runs until its acknowledgement), where none of ours does: the
    slot ids differ, or kvtier, one slot short, admits a row fewer."""
    if d.phase != "next_execution_plan" or not d.what.startswith("forward") or not is_mamba_config(ref.cfg):
        return False

    def written_under_copy(side, snap) -> bool:
        copied = set().union(set(), *side.unacked_mamba_src.values())
        copied |= {x for rec in plan_writeback_records(snap) for x in rec["mamba_src"] or []}
        return any(slot in copied for f in snap["forward"]
                   for key in ("mamba_pool_indices", "mamba_checkpoint_dst_indices")
                   for slot in f[key] if slot >= 0)

    return written_under_copy(ref, snap_ref) and not written_under_copy(ours, snap_ours)


def _refused_pair(note: str, namespace: str):
    """(namespace, reference id, our id) of the pair a bijection of `namespace` (a
    regular expression; a paged group's is "group:" and its id) refused, from its note."""
    m = re.search(rf"({namespace}) id (-?\d+) was mapped to (-?\d+), now to (-?\d+)", note)
    if m:
        return m.group(1), int(m.group(2)), int(m.group(4))
    m = re.search(rf"({namespace}) id (-?\d+) \(ours\) was mapped from (-?\d+), now from (-?\d+)", note)
    if m:
        return m.group(1), int(m.group(4)), int(m.group(2))
    return None


def _forgotten_together(d, ref, ours) -> bool:
    """A plan's paged-group page ids differ (the same free counts) after a step in
    which two or more paged requests stopped: the next plan forgot them, each side in
    its own order, and their pages went back to the pools in it. Either right after
    that step, or later with the very same pages in another order (the pages freed
    together were taken together)."""
    if d.phase != "next_execution_plan" or "paged_cache_block_tables" not in d.what:
        return False
    if not ref.group_ids or ref.sizes() != ours.sizes():
        return False

    def stopped_together(events) -> bool:
        return len({rid for kind, rid, *_ in events if kind in ("Finish", "Abort")}) >= 2

    if ref.log and ref.log[-1][0] == d.step - 1 and stopped_together(ref.log[-1][1]):
        return True
    permuted = (isinstance(d.ref, list) and isinstance(d.ours, list)
                and [sorted(r) for r in d.ref] == [sorted(r) for r in d.ours])
    if permuted and any(stopped_together(events) for _, events in ref.log):
        return True
    # Or one page handed out later: the reference's id and ours are the pages of two
    # different requests that stopped together (each side freed them in its order).
    pair = _refused_pair(d.note or "", r"group:\S+")
    if pair is None:
        return False
    group, ref_id, our_id = pair[0].removeprefix("group:"), pair[1], pair[2]
    for _, events in ref.log:
        stopped = {rid for kind, rid, *_ in events if kind in ("Finish", "Abort")}
        if len(stopped) < 2:
            continue
        held_ref = {rid for rid in stopped if ref_id in ref.group_pages.get(rid, {}).get(group, ())}
        held_ours = {rid for rid in stopped if our_id in ours.group_pages.get(rid, {}).get(group, ())}
        if held_ref and held_ours and held_ref != held_ours:
            return True
    return False


def _row_group_pages(f: dict, i: int) -> dict[str, set[int]]:
    """Row `i`'s pages in each paged-cache group (padding left out)."""
    return {g: {p for p in rows[i] if p >= 0} for g, rows in f["paged_cache_block_tables"].items()}


def _released_tables_earlier(d, ref, ours, plan_ref, plan_ours, steps: int = 4) -> bool:
    """Only paged groups' free page counts differ, kvtier's being higher, and driven on
    (each side answering its own plans) the two agree again within `steps` steps,
    kvtier's counts never lower meanwhile: kvtier freed a finished (or given up)
    request's group pages at once, the reference frees them when it forgets the
    request at its next plan (one step late, for each request that stops)."""
    key = "paged_cache_group_available_pages"
    if key not in d.what:
        return False
    if not (isinstance(d.ref, int) and isinstance(d.ours, int) and d.ours > d.ref):
        return False

    def rest(z) -> dict:
        return {k: v for k, v in z.items() if k != key}

    def ahead(z_ref, z_ours) -> bool:
        return rest(z_ref) == rest(z_ours) and all(
            z_ours[key].get(g, -1) >= n for g, n in z_ref[key].items())

    sides = (ref, ours)
    try:
        if d.phase != "advance":  # finish the step the plan began
            for side, plan in zip(sides, (plan_ref, plan_ours)):
                side.sched.advance(side.build_event(d.step, plan, _write_back_order(plan))[0])
        for k in range(d.step + 1, d.step + 1 + steps):
            plans = []
            for side in sides:
                side.submit(k)
                plans.append(snapshot_plan(side.sched.next_execution_plan(), True))
            z_ref, z_ours = ref.sizes(), ours.sizes()
            if z_ref == z_ours:
                return True
            if not ahead(z_ref, z_ours):
                return False
            for side, plan in zip(sides, plans):
                side.sched.advance(side.build_event(k, plan, _write_back_order(plan))[0])
        return False
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # noqa: BLE001 (a Rust panic is a BaseException)
        return False


def _refused_transport_only_groups(cfg: dict, d) -> bool:
    """kvtier refused a config whose paged-cache groups have no required history group,
    which the reference accepts."""
    groups = {g["group_id"]: g for g in cfg.get("paged_cache_groups") or []}
    required = cfg.get("prefix_cache_adjunct") or []
    no_history = not any(groups.get(r, {}).get("family") == "History" for r in required)
    return bool(groups) and no_history and d.ref is None and "required history group" in str(d.ours)


def _same_copies_split_otherwise(ref_snap, ours_snap, comp) -> bool:
    """The plan's write-backs copy exactly the reference's pages, but split among more
    ops: a request that finished after another with the same prefix, in the same step,
    has an op of its own for the shared pages (which the reference gives it none for)."""
    ref_recs, ours_recs = plan_writeback_records(ref_snap), plan_writeback_records(ours_snap)
    if len(ours_recs) <= len(ref_recs):
        return False
    # Device pages compare through the bijection (they appeared in page tables); the
    # host pages are new to both sides here, so only their count is compared.
    ref_src = sorted(p for r in ref_recs for p in r["src"])
    ours_src = sorted(p for r in ours_recs for p in comp.to_ref("device", r["src"]))
    same_dst = sum(len(r["dst"]) for r in ref_recs) == sum(len(r["dst"]) for r in ours_recs)
    return ref_src == ours_src and same_dst


def _loads_back_less_than_it_evicted(d, ref, ours, ref_snap, ours_snap) -> bool:
    """The plan's load-backs differ, both sides change the tree alike (the same KV
    events), and the reference's plan evicts device copies of blocks it then stores
    again, while it copies that many pages fewer than kvtier: blocks it re-attached to
    device without loading them back."""
    if d.phase != "next_execution_plan" or not d.what.startswith("LoadBackOp"):
        return False
    k_ref = snapshot_kv_events(ref.sched.drain_kv_events())
    k_ours = snapshot_kv_events(ours.sched.drain_kv_events())
    if sorted(map(repr, k_ref)) != sorted(map(repr, k_ours)):
        return False
    removed = {h for kind, hashes, *_ in k_ref if kind == "BlockRemoved" for h in hashes}
    restored = [h for kind, hashes, *_ in k_ref if kind == "BlockStored" for h in hashes if h in removed]

    def copied(snap) -> int:
        return sum(len(p) for c in snap["cache"] if c["type"] == "LoadBackOp" for p in c["src_pages"] or [])

    return bool(restored) and copied(ours_snap) == copied(ref_snap) + len(restored)


def _write_back_order(snap: dict) -> list[int]:
    """A plan's write-back op ids in plan order (the order the driver acknowledges)."""
    return [r["op_id"] for r in plan_writeback_records(snap)]


def _reference_alone(ref, start: int, steps: int):
    """Drives the reference on alone from step `start`: yields each plan's snapshot,
    then answers it as its driver would."""
    for k in range(start, start + steps):
        ref.submit(k)
        snap = snapshot_plan(ref.sched.next_execution_plan(), is_hybrid_config(ref.cfg))
        ref.sched.drain_kv_events()
        yield snap
        ref.sched.advance(ref.build_event(k, snap, _write_back_order(snap))[0])
        ref.sched.drain_kv_events()


def _reference_reads_wrong_state(ref, step: int, phase: str, plan: dict | None,
                                 steps: int = 8) -> bool:
    """The reference, driven on alone, runs a row on a recurrent state of another depth
    than the row's history within `steps` steps: what kvtier did instead at `step` (give
    up a retracted request's shallower state and recompute it) shows first as other
    queue counts."""
    try:
        if phase != "advance" and plan is not None:  # finish the step the plan began
            ref.sched.advance(ref.build_event(step, plan, _write_back_order(plan))[0])
            ref.sched.drain_kv_events()
        return any(ref.states.apply(snap) for snap in _reference_alone(ref, step + 1, steps))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # noqa: BLE001
        return False


def _reference_ties_host_states(d, ref, ours, shifts=range(100, 1700, 100)) -> bool:
    """A write-back's host state slots differ, and the reference's own choice there is
    not fixed: run again on the script in fresh processes whose heaps are shifted by
    `shifts` allocations first (the order of its tied candidates follows their
    addresses), it makes kvtier's plan at that step, or it picks other slots and
    kvtier's are among those it drew. Only for unknown divergences in those slots;
    it stops at the first probe that settles it."""
    if not (d.what.startswith("WriteBackOp") and d.what.endswith("['mamba']")):
        return False
    if not (isinstance(d.ref, list) and isinstance(d.ours, list) and len(d.ref) == len(d.ours)):
        return False
    seen, drawn = {tuple(d.ref)}, set(d.ref)
    for shift in shifts:
        other = run_elsewhere(ref.script, ref.mod, ours.mod, shift)
        if other is None:
            continue
        if other["step"] is None or other["step"] > d.step:
            return True  # it made kvtier's plan
        if other["step"] == d.step and other["what"] == d.what:
            seen.add(tuple(other["ref"]))
            drawn.update(other["ref"])
            if len(seen) > 1 and set(d.ours) <= drawn:
                return True
    return False


def run_elsewhere(script: dict, ref_module, kv_module, shift: int,
                  classify: bool = False) -> dict | None:
    """Runs `script` through both modules again in a fresh process whose heap `shift`
    allocations moved first: its first divergence as `step`, `what`, `ref` (`step` None
    when there is none) and, with `classify`, `known`; None when it could not run."""
    import subprocess

    def spec(module) -> str:
        if not module.__name__.startswith("_differential"):
            return module.__name__
        path = Path(module.__file__)
        return str(path.parent if path.name == "__init__.py" else path)

    request = {
        "script": script,
        "shift": shift,
        "classify": classify,
        "reference": str(Path(ref_module.__file__).resolve().parents[1]),
        "ours": spec(kv_module),
    }
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
            "import differential; differential._probe_main()")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        done = subprocess.run([sys.executable, "-c", code], input=json.dumps(request),
                              capture_output=True, text=True, timeout=120, env=env)
        return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def _probe_main() -> None:
    """The process of `run_elsewhere`: shifts the heap, then runs the script and prints
    its first divergence as JSON."""
    import ctypes

    request = json.loads(sys.stdin.read())
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    rng = random.Random(request["shift"])
    for _ in range(request["shift"]):  # never freed: the scheduler's nodes land elsewhere
        libc.malloc(rng.randrange(16, 4096))
    ref = load_reference(request["reference"])
    ours = load_module(request["ours"])
    result = run_script(request["script"], ref, ours, classify=request["classify"])
    d = result.divergence
    out = {"step": None} if d is None else {"step": d.step, "what": d.what, "ref": d.ref,
                                            "known": result.known}
    print(json.dumps(out, default=repr))


def _reference_stalls(ref, step: int, phase: str = "", plan: dict | None = None,
                      steps: int = 80, quiet: int = 2) -> bool:
    """The reference, driven on alone by its driver, for `quiet` steps in a row runs no
    row and no copy, with no acknowledgement due and its sizes unchanged, while it holds
    retracted requests, or waiting ones with nothing running: a deadlock (nothing but
    an abort the script sends later can end it; kvtier breaks it by recomputing the
    request, or gives up one that can never fit again, or never had it). A divergence
    right after a plan counts that plan as the first of those steps (an abort the
    script sends at the next step may end the deadlock kvtier broke at once), and the
    idle plans right before it with no arrival or event since (the reference was at
    that fixed point already; under the reference policies kvtier breaks the deadlock
    only at its second empty plan, and a request arriving later may still run)."""

    def stalled(snap) -> tuple[bool, dict]:
        ran = any(f["request_ids"] for f in snap["forward"])
        idle = not ran and not snap["cache"] and not ref.pending_acks
        sizes = ref.sizes()
        stuck = sizes["retract_count"] > 0 or (
            sizes["waiting_size"] > 0 and not sizes["prefilling_size"] and not sizes["decoding_size"])
        return idle and stuck, sizes

    try:
        # Driven without the script's later aborts: the question is whether anything
        # else could end it.
        ref.reqs = {rid: dict(r, abort_at=None) for rid, r in ref.reqs.items()}
        still, last = 0, None
        if phase == "next_execution_plan" and plan is not None:
            before = ref.idle_plans
            idle, last = stalled(plan)
            still = int(idle) + (before if idle else 0)
            if still >= quiet:
                return True
            ref.sched.advance(ref.build_event(step, plan, _write_back_order(plan))[0])
            ref.sched.drain_kv_events()
        for snap in _reference_alone(ref, step + 1, steps):
            idle, sizes = stalled(snap)
            still = still + 1 if idle and sizes == last else 0
            last = sizes
            if still >= quiet:
                return True
        return False
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # noqa: BLE001
        return False


def _pickle_result(run) -> bytes:
    """The pickled outcome of `run()` for a child process: ("ok", RunResult) or
    ("error", traceback) when the harness itself failed (that must not look like a
    crash). A divergence holding values pickle cannot take keeps their reprs."""
    import pickle
    import traceback

    try:
        result = run()
    except Exception:  # noqa: BLE001
        return pickle.dumps(("error", traceback.format_exc()))
    try:
        return pickle.dumps(("ok", result))
    except Exception:  # noqa: BLE001
        d = result.divergence
        if d is not None:
            result.divergence = Divergence(d.step, d.phase, d.what, repr(d.ref), repr(d.ours), d.note)
        return pickle.dumps(("ok", result))


def _unpickle_result(data: bytes, script: dict) -> RunResult:
    import pickle

    kind, value = pickle.loads(data)
    if kind == "error":
        raise RuntimeError(f"the harness failed on seed {script.get('seed')}:\n{value}")
    return value


def run_isolated(script: dict, ref_module, kv_module, id_modes: dict | None = None) -> RunResult:
    """run_script in a forked child, so that a crash (the reference segfaults on some
    inputs) is reported instead of killing the harness. When the child dies, the script
    is run again (isolated) with the reference on both sides to tell whose crash it was;
    `result.crashed` then says "reference" or "ours", and a crash of ours alone is
    reported as a divergence."""
    import signal

    def child_run(a, b):
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            os.close(rfd)
            try:
                data = _pickle_result(lambda: run_script(script, a, b, id_modes))
                with os.fdopen(wfd, "wb") as f:
                    f.write(data)
            finally:
                os._exit(0)
        os.close(wfd)
        with os.fdopen(rfd, "rb") as f:
            data = f.read()
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status) or not data:
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            name = signal.Signals(sig).name if sig else f"exit {os.WEXITSTATUS(status)}"
            return None, name
        return _unpickle_result(data, script), None

    res, crash = child_run(ref_module, kv_module)
    if crash is None:
        return res
    result = RunResult(script)
    if kv_module is not ref_module:
        _, ref_crash = child_run(ref_module, ref_module)
        whose = "reference" if ref_crash else "ours"
    else:
        whose = "reference"
    result.crashed = f"{whose} ({crash})"
    if whose == "ours":
        result.divergence = Divergence(-1, "crash", "process crashed", "no crash", crash,
                                       "re-run the script without --isolate to see where")
    return result


def run_many(scripts: list[dict], ref_module, kv_module, id_modes: dict | None = None,
             isolate: bool = True):
    """Yields a RunResult per script, in order. With `isolate`, the scripts run in a
    forked child that streams results back; when the child dies, the script it was
    running is re-run alone (run_isolated) to say whose crash it was, and a new child
    goes on with the next script. One fork per crash, not per script."""
    import signal
    import struct

    if not isolate or not hasattr(os, "fork"):
        for script in scripts:
            yield run_script(script, ref_module, kv_module, id_modes)
        return
    start = 0
    while start < len(scripts):
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: run scripts[start:], one length-prefixed pickle each
            os.close(rfd)
            try:
                with os.fdopen(wfd, "wb", buffering=0) as out:
                    for script in scripts[start:]:
                        data = _pickle_result(lambda: run_script(script, ref_module, kv_module, id_modes))
                        out.write(struct.pack("<Q", len(data)) + data)
            finally:
                os._exit(0)
        os.close(wfd)
        reaped = False
        try:
            with os.fdopen(rfd, "rb") as inp:
                while True:
                    head = inp.read(8)
                    if len(head) < 8:
                        break
                    (n,) = struct.unpack("<Q", head)
                    data = inp.read(n)
                    if len(data) < n:
                        break
                    start += 1
                    yield _unpickle_result(data, scripts[start - 1])
            os.waitpid(pid, 0)
            reaped = True
        finally:
            if not reaped:  # the caller stopped early: end our child, by its pid
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        if start < len(scripts):  # the child died running scripts[start]
            yield run_isolated(scripts[start], ref_module, kv_module, id_modes)
            start += 1


# --------------------------------------------------------------------------------------
# Shrinking
# --------------------------------------------------------------------------------------

def _copy(script: dict) -> dict:
    return ast.literal_eval(repr(script))


def _candidates(script: dict):
    """Smaller variants of a script, most aggressive first."""
    reqs = script["requests"]
    # Drop requests: half at a time, then one at a time.
    n = len(reqs)
    if n > 1:
        for chunk in (n // 2, 1):
            if chunk < 1:
                continue
            for start in range(0, n, chunk):
                s = _copy(script)
                s["requests"] = reqs[:start] + reqs[start + chunk:]
                if s["requests"]:
                    yield s
    if script.get("wb_delays"):
        s = _copy(script)
        s["wb_delays"] = {}
        yield s
        for k in list(script["wb_delays"]):
            s = _copy(script)
            del s["wb_delays"][k]
            yield s
    for i, r in enumerate(reqs):
        if r.get("abort_at") is not None:
            s = _copy(script)
            s["requests"][i]["abort_at"] = None
            yield s
        if r.get("reserve"):
            s = _copy(script)
            s["requests"][i]["reserve"] = {}
            yield s
        if r["arrive"] > 0:
            for arrive in (0, r["arrive"] // 2, r["arrive"] - 1):
                s = _copy(script)
                s["requests"][i]["arrive"] = arrive
                if s["requests"][i].get("abort_at") is not None:
                    s["requests"][i]["abort_at"] = max(s["requests"][i]["abort_at"], arrive)
                yield s
        for gen in (1, r["gen"] // 2, r["gen"] - 1):
            if 1 <= gen < r["gen"]:
                s = _copy(script)
                s["requests"][i]["gen"] = gen
                s["requests"][i]["reserve"] = {k: v for k, v in r.get("reserve", {}).items() if k < gen}
                yield s
        p = r["prompt"]
        page = script["config"]["page_size"]
        for new in (p[: len(p) // 2], p[len(p) // 2:], p[:-page], p[page:], p[:-1], p[1:]):
            if new and len(new) < len(p):
                s = _copy(script)
                s["requests"][i]["prompt"] = new
                yield s
        if any(t != 1 for t in p):
            s = _copy(script)
            s["requests"][i]["prompt"] = [1] * len(p)
            yield s
    cfg = script["config"]
    for key, value in (("enable_mixed_prefill_decode", False), ("disable_prefix_cache", False),
                       ("max_batch_size", 1), ("decode_input_tokens", 1), ("num_host_pages", 0)):
        if key in cfg and cfg[key] != value:
            s = _copy(script)
            s["config"][key] = value
            yield s
    if cfg.get("num_device_pages", 0) > 2:
        s = _copy(script)
        s["config"]["num_device_pages"] -= 1
        yield s
        # A shorter prompt in a pool one page smaller keeps the same pressure.
        page = cfg["page_size"]
        for i, r in enumerate(reqs):
            if len(r["prompt"]) > page:
                s = _copy(script)
                s["config"]["num_device_pages"] -= 1
                s["requests"][i]["prompt"] = r["prompt"][:-page]
                yield s


def shrink_script(script: dict, still_fails, budget_s: float = 60.0, max_tries: int = 3000) -> dict:
    """Greedy shrink: keeps the first smaller valid variant for which `still_fails(s)` is
    true, until no variant helps (or the time/tries budget runs out)."""
    best = script
    deadline = time.monotonic() + budget_s
    tries = 0
    improved = True
    while improved and time.monotonic() < deadline and tries < max_tries:
        improved = False
        for cand in _candidates(best):
            if time.monotonic() >= deadline or tries >= max_tries:
                break
            if script_problems(cand):
                continue
            tries += 1
            if still_fails(cand):
                best = cand
                improved = True
                break
    return best


# --------------------------------------------------------------------------------------
# Known differences
# --------------------------------------------------------------------------------------

def load_known(path: str | None) -> list[dict]:
    """A JSON list (or {"known": [...]}) of entries, each with a `what` regex matched
    (fullmatch) against the divergence's field, and optional `detail` (regex searched in
    the reference value, our value and the note), `seeds` (a list), `hybrid` (bool) and
    `note` (free text)."""
    if not path:
        return []
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, dict):
        data = data.get("known", [])
    return data


def match_known(known: list[dict], script: dict, d: Divergence) -> dict | None:
    for entry in known:
        if "seeds" in entry and script.get("seed") not in entry["seeds"]:
            continue
        if "hybrid" in entry and bool(entry["hybrid"]) != bool(script.get("hybrid")):
            continue
        if not re.fullmatch(entry["what"], d.what):
            continue
        if "detail" in entry:
            text = f"{d.ref!r}\n{d.ours!r}\n{d.note}"
            if not re.search(entry["detail"], text):
                continue
        return entry
    return None


# --------------------------------------------------------------------------------------
# Mutation check: the harness finds planted differences and tolerates allowed ones
# --------------------------------------------------------------------------------------

class _Obj:
    """A plain stand-in for a plan's forward op (attributes plus num_extends())."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def num_extends(self):
        return len(self.extend_prefix_lens)


class WriteBackOp(_Obj):  # named like the API's classes: the harness reads type names
    pass


class LoadBackOp(_Obj):
    pass


def _copy_fields(obj, names):
    return {n: getattr(obj, n) for n in names if hasattr(obj, n)}


class _MutantScheduler:
    """The reference's Scheduler with one planted change to what it shows."""

    def __init__(self, inner, mutation: str, cfg):
        self._inner, self._m, self._step = inner, mutation, 0
        self._n = cfg.num_device_pages

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _page(self, p):
        if p <= 0:
            return p
        if self._m == "relabel_device":
            return self._n - p  # a consistent permutation of 1..N-1
        if self._m == "relabel_inconsistent" and self._step >= 8:
            return self._n - p
        return p

    def next_execution_plan(self):
        plan = self._inner.next_execution_plan()
        self._step += 1
        pages = lambda rows: [[self._page(p) for p in row] for row in rows]
        forwards = []
        for f in plan.forward:
            d = _copy_fields(f, FORWARD_FIELDS + MAMBA_FIELDS + (
                "paged_cache_block_tables", "paged_cache_block_table_base_offsets"))
            d["occupied_pages"] = pages(d["occupied_pages"])
            d["new_occupied_pages"] = pages(d["new_occupied_pages"])
            if self._m == "pool_shift":
                d["request_pool_indices"] = [i + 1 for i in d["request_pool_indices"]]
            if self._m == "swap_rows" and f.num_extends() >= 2:
                n = f.num_extends()
                for key in ("request_ids", "request_pool_indices", "input_lengths", "prefill_lengths",
                            "occupied_pages", "begins", "sizes", "new_occupied_pages", "extend_prefix_lens"):
                    d[key] = d[key][:n][::-1] + d[key][n:]
            forwards.append(_Obj(**d))
        cache = []
        for op in plan.cache:
            d = _copy_fields(op, ("op_ids", "src_pages", "dst_pages", "src_pages_by_kind",
                                  "dst_pages_by_kind", "is_retract"))
            is_wb = type(op).__name__ == "WriteBackOp"
            side = "src_pages" if is_wb else "dst_pages"
            d[side] = pages(d[side])
            d[side + "_by_kind"] = dict(d[side + "_by_kind"], kv=pages(d[side + "_by_kind"]["kv"]))
            if is_wb and self._m == "reverse_writebacks":
                d = {k: (dict((kk, vv[::-1]) for kk, vv in v.items()) if isinstance(v, dict) else v[::-1])
                     for k, v in d.items()}
            cache.append((WriteBackOp if is_wb else LoadBackOp)(**d))
        return _Obj(forward=forwards, cache=cache)

    def advance(self, event):
        if self._m == "raise" and self._step == 5:
            raise ValueError("planted")
        return self._inner.advance(event)

    def drain_kv_events(self):
        events = self._inner.drain_kv_events()
        if self._m == "drop_block_removed":
            events = [e for e in events if e.kind != "BlockRemoved"]
        return events

    def available_kv_pages(self):
        n = self._inner.available_kv_pages()
        return n + 1 if self._m == "available_off_by_one" and n > 3 else n


class _MutantModule:
    """The reference module with Scheduler wrapped (everything else the reference's)."""

    def __init__(self, ref, mutation: str):
        self._ref, self._m = ref, mutation

    def __getattr__(self, name):
        return getattr(self._ref, name)

    def Scheduler(self, cfg):  # noqa: N802 - the API's name
        return _MutantScheduler(self._ref.Scheduler(cfg), self._m, cfg)


# mutation -> (whether the harness must report a divergence, extra id modes)
MUTATIONS = {
    "identity": (False, {}),
    "relabel_device": (False, {}),          # consistent bijection: allowed, ids not exact
    "reverse_writebacks": (False, {}),      # write-backs compare as a multiset
    "pool_shift": (True, {}),               # pool indices compare exactly by default ...
    "pool_shift+bijection": (False, {"pool": "bijection"}),  # ... or through a bijection
    "relabel_inconsistent": (True, {}),
    "swap_rows": (True, {}),
    "available_off_by_one": (True, {}),
    "drop_block_removed": (True, {}),
    "raise": (True, {}),
}


def mutation_check(ref, seeds, hybrid=False) -> list[str]:
    """Runs every mutant against the reference; returns what went wrong (empty: the
    harness found every planted difference and accepted every allowed one)."""
    problems = []
    scripts = [generate_script(s, hybrid) for s in seeds]
    for name, (must_fail, modes) in MUTATIONS.items():
        mutant = _MutantModule(ref, name.split("+")[0])
        results = [run_script(sc, ref, mutant, modes) for sc in scripts]
        # A mutant is the reference: a wrong state it reads (C.3, C.6) shows on the
        # side under test, and is the reference's bug, not a planted difference.
        failed = [r for r in results if r.divergence is not None
                  and r.divergence.what != WRONG_STATE_OURS]
        exact = sum(r.exact_ids for r in results if r.divergence is None)
        line = f"{name:24s} divergences {len(failed):3d}/{len(results)}  exact ids {exact}"
        if failed:
            line += f"  first: seed {failed[0].script['seed']} {failed[0].divergence.what}"
        print(line)
        if must_fail and not failed:
            problems.append(f"{name}: planted difference not found")
        if not must_fail and failed:
            problems.append(f"{name}: allowed difference reported: {failed[0].divergence.report()}")
        if name == "relabel_device" and exact == len(results):
            problems.append("relabel_device: ids reported exactly equal")
    return problems


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------

def _literal(obj, indent: int = 0) -> str:
    """A Python literal: dicts a key a line, lists of scalars on one line (wrapped)."""
    pad = " " * indent
    if len(repr(obj)) <= 100 - indent:
        return repr(obj)
    if isinstance(obj, dict):
        items = [f"{pad}    {k!r}: {_literal(v, indent + 4)}," for k, v in obj.items()]
        return "{\n" + "\n".join(items) + f"\n{pad}}}"
    if isinstance(obj, list):
        if all(not isinstance(v, (dict, list)) for v in obj):
            chunks = [", ".join(repr(v) for v in obj[i:i + 20]) for i in range(0, len(obj), 20)]
            return "[" + f",\n{pad}     ".join(chunks) + "]"
        items = [f"{pad}    {_literal(v, indent + 4)}," for v in obj]
        return "[\n" + "\n".join(items) + f"\n{pad}]"
    return repr(obj)


def format_script(script: dict) -> str:
    """A self-contained Python literal (the replay file's content)."""
    text = _literal(script)
    assert ast.literal_eval(text) == script
    return "# kvtier differential script: python differential.py --replay FILE\n" + text + "\n"


def read_script(path: str) -> dict:
    text = Path(path).read_text()
    return ast.literal_eval(text.split("\n", 1)[1] if text.startswith("#") else text)


def parse_seeds(text: str) -> list[int]:
    seeds = []
    for part in text.split(","):
        if ":" in part:
            a, b = part.split(":")
            seeds.extend(range(int(a), int(b)))
        else:
            seeds.append(int(part))
    return seeds


def summarize(results: list[RunResult], elapsed: float) -> str:
    total = collections.Counter()
    flags = collections.Counter()
    for r in results:
        total.update(r.stats)
        flags.update(r.flags)
    n = len(results) or 1
    lines = [f"scripts run: {len(results)} in {elapsed:.1f}s",
             f"  idle at the end: {sum(r.idle for r in results)}, stalled: {sum(r.stalled for r in results)}, "
             f"hit step limit: {sum(not r.idle and not r.stalled and r.divergence is None and not r.crashed for r in results)}"]
    lines.append("  scripts exercising: " + ", ".join(
        f"{k} {flags[k]} ({100 * flags[k] // n}%)"
        for k in ("retract", "retract_writeback", "writeback", "loadback", "evict", "abort",
                  "prefix_hit", "dropped")))
    lines.append("  totals: " + ", ".join(f"{k}={total[k]}" for k in STAT_KEYS))
    compared = [r for r in results if r.divergence is None and not r.crashed]
    exact = sum(r.exact_ids for r in compared)
    lines.append(f"  ids exactly equal throughout in {exact}/{len(compared)} agreeing scripts")
    unequal = collections.Counter()
    for r in compared:
        for ns, m in r.id_maps.items():
            if m.unequal:
                unequal[ns.split(":")[0]] += 1
    if unequal:
        lines.append("  scripts with unequal (but consistently mapped) ids, by namespace: "
                     + ", ".join(f"{k}={v}" for k, v in sorted(unequal.items())))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0:100", help="seed range a:b (b excluded), or a list a,b,c")
    ap.add_argument("--hybrid", action="store_true", help="generate hybrid (Mamba / paged-group) configs")
    ap.add_argument("--ours", default=DEFAULT_OURS,
                    help="module under test: dotted name (default %(default)s), package directory or file")
    ap.add_argument("--ours-path", action="append", default=[], help="directory to put first on sys.path")
    ap.add_argument("--reference-path", default=str(DEFAULT_REFERENCE_PATH))
    ap.add_argument("--known", help="JSON file of known differences")
    ap.add_argument("--self-check", action="store_true",
                    help="compare the reference with itself (two Scheduler instances)")
    ap.add_argument("--replay", help="run one script file (a Python literal) instead of seeds")
    ap.add_argument("--mutation-check", action="store_true",
                    help="check the harness itself: plant differences in a wrapped reference")
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("--no-isolate", dest="isolate", action="store_false",
                    help="run scripts in this process (default: each in a forked child, so a crash is reported)")
    ap.add_argument("--shrink-seconds", type=float, default=60.0)
    ap.add_argument("--max-failures", type=int, default=5, help="stop after this many new divergences")
    ap.add_argument("--save-dir", default=os.path.join(tempfile.gettempdir(), "kvtier-differential"),
                    help="where shrunk scripts are written")
    ap.add_argument("--id-mode", action="append", default=[], metavar="NS=MODE",
                    help="e.g. pool=bijection or device=exact (namespaces: %s)" % ", ".join(ID_MODES))
    ap.add_argument("--print-script", action="store_true", help="print the generated scripts and exit")
    ap.add_argument("--trace", action="store_true", help="print the reference side's steps")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)

    faulthandler.enable()
    # The reference logs a warning per failed retraction; keep its stderr readable.
    os.environ.setdefault("SPDLOG_LEVEL", "error")
    id_modes = {}
    for item in args.id_mode:
        ns, _, mode = item.partition("=")
        if mode not in ("exact", "bijection", "any"):
            ap.error(f"bad --id-mode {item}")
        id_modes[ns] = mode

    if args.replay:
        scripts = [read_script(args.replay)]
        for problem in script_problems(scripts[0]):
            print(f"warning: the script is outside the generator's valid region: {problem}")
    else:
        scripts = [generate_script(s, args.hybrid) for s in parse_seeds(args.seeds)]
    if args.print_script:
        for s in scripts:
            print(format_script(s))
        return 0

    ref = load_reference(args.reference_path)
    if args.mutation_check:
        problems = mutation_check(ref, parse_seeds(args.seeds), args.hybrid)
        for p in problems:
            print("PROBLEM:", p)
        print("mutation check:", "FAILED" if problems else "ok")
        return 1 if problems else 0
    if args.self_check:
        ours = ref
    else:
        try:
            ours = load_module(args.ours, extra_paths=args.ours_path)
        except ImportError as e:
            print(f"cannot load the module under test ({args.ours}): {e}", file=sys.stderr)
            return 2
        if ours is ref:
            print("--ours resolved to the reference module itself; use --self-check for that", file=sys.stderr)
            return 2
    print(f"reference: {getattr(ref, '__file__', ref)}")
    print(f"ours:      {getattr(ours, '__file__', ours)}" + ("  (self-check)" if ours is ref else ""))
    known = load_known(args.known)

    started = time.monotonic()
    results = []
    isolate = args.isolate and hasattr(os, "fork") and not args.trace

    def run(script):
        if isolate:
            return run_isolated(script, ref, ours, id_modes)
        return run_script(script, ref, ours, id_modes, trace=print if args.trace else None)

    if args.trace:
        stream = (run(script) for script in scripts)
    else:
        stream = run_many(scripts, ref, ours, id_modes, isolate)
    new_failures = 0
    known_hits = 0
    known_kinds = collections.Counter()
    ref_crashes = []
    for result in stream:
        script = result.script
        seed = script.get("seed")
        if args.verbose:
            print(f"seed {seed}: {'idle' if result.idle else 'stalled' if result.stalled else 'not idle'}"
                  f"{', crashed: ' + result.crashed if result.crashed else ''}", file=sys.stderr, flush=True)
        results.append(result)
        if result.exceptions and args.verbose:
            for line in result.exceptions[:3]:
                print(f"  seed {seed}: both raised at {line}")
        if result.crashed and result.crashed.startswith("reference"):
            # Not a difference between the two: the script is one the reference cannot
            # run (a generator bug to fix). Reported, shrunk, and counted as a failure.
            entry = match_known(known, script, Divergence(-1, "crash", "reference crash", None, None))
            if entry is not None:
                known_hits += 1
                continue
            ref_crashes.append(seed)
            print("=" * 100)
            print(f"seed {seed} hybrid={script.get('hybrid')}: the REFERENCE crashed: {result.crashed}")
            if not args.no_shrink and isolate:
                small = shrink_script(
                    script, lambda s: bool(run_isolated(s, ref, ref).crashed), budget_s=args.shrink_seconds)
                _save_and_print(small, args, f"seed-{seed}-refcrash")
            continue
        d = result.divergence
        if d is None:
            continue
        if result.known is not None:
            known_hits += 1
            known_kinds[result.known] += 1
            if args.verbose:
                print(f"seed {seed}: known difference {result.known}: {d.what}")
            continue
        entry = match_known(known, script, d)
        if entry is not None:
            known_hits += 1
            print(f"seed {seed}: known difference ({entry.get('note', entry['what'])}): {d.what}")
            continue
        new_failures += 1
        print("=" * 100)
        print(f"seed {seed} hybrid={script.get('hybrid')}")
        print(d.report())
        for line in result.context:
            print("  " + line)
        if not args.no_shrink:
            # In-process runs (fast; a Rust panic is an exception, and plain-KV scripts
            # have never crashed the reference); a crash of ours is shrunk isolated.
            runner = run if result.crashed else (lambda s: run_script(s, ref, ours, id_modes))
            # Shrink to a script that still shows an unexplained divergence.
            small = shrink_script(script, lambda s: _new_divergence(runner(s)),
                                  budget_s=args.shrink_seconds)
            small_result = runner(small)
            print("-" * 100)
            print(f"shrunk to {len(small['requests'])} request(s); its divergence:")
            if small_result.divergence is not None:
                print(small_result.divergence.report())
                for line in small_result.context:
                    print("  " + line)
            _save_and_print(small, args, f"seed-{seed}{'-hybrid' if script.get('hybrid') else ''}")
        if new_failures >= args.max_failures:
            print(f"stopping after {new_failures} divergences")
            break

    elapsed = time.monotonic() - started
    print("=" * 100)
    print(summarize(results, elapsed))
    n_exc = sum(r.stats["reference_exceptions"] for r in results)
    if n_exc:
        first = next(r for r in results if r.exceptions)
        print(f"  WARNING: the reference raised {n_exc} time(s) (invalid events?), "
              f"first in seed {first.script.get('seed')}: {first.exceptions[0]}")
    if ref_crashes:
        print(f"  the reference crashed on {len(ref_crashes)} script(s): seeds {ref_crashes}")
    print(f"divergences: {new_failures} new, {known_hits} known"
          + "".join(f"\n  known {kind}: {n}" for kind, n in sorted(known_kinds.items())))
    if ref_crashes or (args.self_check and n_exc):
        return 1
    return 1 if new_failures else 0


def _save_and_print(script: dict, args, name: str) -> None:
    text = format_script(script)
    print(text)
    os.makedirs(args.save_dir, exist_ok=True)
    path = os.path.join(args.save_dir, name + ".py")
    Path(path).write_text(text)
    print(f"saved to {path}  (re-run: python {sys.argv[0]} --replay {path})")


if __name__ == "__main__":
    sys.exit(main())

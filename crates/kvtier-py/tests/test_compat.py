"""kvtier's `tokenspeed_scheduler` drop-in against the reference module's API: the same
names, fields, defaults, conversions and errors; and the differences kvtier makes on
purpose (docs/python.md), each shown to differ the documented way."""

import os
import subprocess
import sys

import pytest

FIELDS = [
    "page_size", "max_scheduled_tokens", "max_batch_size", "decode_input_tokens",
    "overlap_schedule_depth", "role", "num_device_pages", "num_host_pages",
    "paged_cache_groups", "prefix_cache_adjunct", "disable_l2_cache", "enable_l3_storage",
    "prefetch_threshold", "enable_kv_cache_events", "enable_mixed_prefill_decode",
    "disable_prefix_cache", "enable_mamba", "mamba_cache_chunk_size", "mamba_pool_total_chunks",
    "enable_mamba_l2", "mamba_l2_host_slots",
]
SUBMODULES = ["Forward", "Cache", "ForwardEvent", "PD", "KVEvent"]


def public(obj):
    return {n for n in dir(obj) if not n.startswith("_")}


def config(ts, **fields):
    cfg = ts.SchedulerConfig()
    base = dict(page_size=4, num_device_pages=16, num_host_pages=16, max_scheduled_tokens=8,
                max_batch_size=4, enable_kv_cache_events=True)
    base.update(fields)
    for name, value in base.items():
        setattr(cfg, name, value)
    return cfg


def spec(ts, rid, tokens):
    r = ts.RequestSpec()
    r.request_id = rid
    r.tokens = tokens
    return r


def test_every_name_of_the_reference_exists_with_its_members(reference, ours):
    assert set(reference.__all__) <= set(ours.__all__)
    for name in reference.__all__:
        ref, kv = getattr(reference, name), getattr(ours, name)
        missing = public(ref) - public(kv)
        assert not missing, f"{name} lacks {sorted(missing)}"
    for sub in SUBMODULES:
        for name in public(getattr(reference, sub)):
            ref = getattr(getattr(reference, sub), name)
            kv = getattr(getattr(ours, sub), name)
            missing = public(ref) - public(kv)
            assert not missing, f"{sub}.{name} lacks {sorted(missing)}"


def test_config_defaults_are_the_reference_defaults(reference, ours):
    ref, kv = reference.SchedulerConfig(), ours.SchedulerConfig()
    for field in FIELDS:
        a, b = getattr(ref, field), getattr(kv, field)
        if hasattr(a, "name"):
            assert (a.name, a.value) == (b.name, b.value), field
        else:
            assert a == b, field


def test_enums_are_real_enums_and_setters_take_ints(ours):
    cfg = ours.SchedulerConfig()
    role = ours.SchedulerConfig.Role
    assert role.Fused.name == "Fused" and role(2) is role.Fused
    assert role.Fused != 2
    cfg.role = 0
    assert cfg.role is role.P
    with pytest.raises(ValueError):
        cfg.role = 7
    group = ours.PagedCacheGroupConfig("g", 4, 1, 8, ours.PagedCacheRetention.SlidingWindow, 16)
    assert group.retention is ours.PagedCacheRetention.SlidingWindow
    assert group.family is ours.PagedCacheGroupFamily.History


def test_getters_copy_scalars_and_share_bound_objects(reference, ours):
    for ts in (reference, ours):
        r = ts.RequestSpec()
        r.tokens = (1, 2, 3)
        r.tokens.append(4)
        assert r.tokens == [1, 2, 3]
        cfg = ts.SchedulerConfig()
        g = ts.PagedCacheGroupConfig("g", 4, 1, 8)
        cfg.paged_cache_groups = [g]
        g.total_pages = 99  # the setter copied it
        assert cfg.paged_cache_groups[0].total_pages == 8
        cfg.paged_cache_groups[0].total_pages = 9  # elements are the config's own
        assert cfg.paged_cache_groups[0].total_pages == 9
        cfg.paged_cache_groups.append(ts.PagedCacheGroupConfig("h", 4, 1, 8))
        assert len(cfg.paged_cache_groups) == 1
        with pytest.raises(AttributeError):
            r.not_a_field = 1


def test_add_event_returns_the_same_object_and_refuses_other_types(reference, ours):
    for ts in (reference, ours):
        ev = ts.ExecutionEvent()
        f = ts.ForwardEvent.Finish()
        f.request_id = "x"
        assert ev.add_event(f) is ev
        assert ev.add_event(f).add_event(ts.PD.FailedEvent("x")) is ev
        with pytest.raises(TypeError):
            ev.add_event("not an event")


@pytest.mark.parametrize(
    "fields",
    [
        dict(decode_input_tokens=-1),
        dict(overlap_schedule_depth=2),
        dict(overlap_schedule_depth=1, decode_input_tokens=0),
    ],
)
def test_constructor_errors_have_the_reference_types_and_messages(reference, ours, fields):
    errors = []
    for ts in (reference, ours):
        with pytest.raises(ValueError) as caught:
            ts.Scheduler(config(ts, **fields))
        errors.append(str(caught.value))
    assert errors[0] == errors[1]


@pytest.mark.parametrize(
    "groups, required, ",
    [
        ([("", 4, 1, 8)], None),
        ([("g", 0, 1, 8)], None),
        ([("g", 4, 1, 0)], None),
        ([("g", 4, 1, 8), ("g", 4, 1, 8)], None),
        ([("g", 4, 1, 8)], []),
        ([("g", 4, 1, 8)], ["nope"]),
    ],
)
def test_paged_group_errors_match_the_reference(reference, ours, groups, required):
    errors = []
    for ts in (reference, ours):
        cfg = config(ts)
        cfg.paged_cache_groups = [ts.PagedCacheGroupConfig(*g) for g in groups]
        if required is not None:
            adjunct = ts.PrefixCacheAdjunctSpec()
            adjunct.required_groups = required
            cfg.prefix_cache_adjunct = adjunct
        with pytest.raises(ValueError) as caught:
            ts.Scheduler(cfg)
        errors.append(str(caught.value))
    assert errors[0] == errors[1]


def test_first_plans_and_their_repr_equal_the_reference(reference, ours):
    reprs = []
    for ts in (reference, ours):
        s = ts.Scheduler(config(ts))
        s.submit_requests([spec(ts, "A", list(range(100, 110))), spec(ts, "B", list(range(100, 108)) + [3, 4, 5])])
        plan = s.next_execution_plan()
        assert plan.forward is not plan.forward  # fresh views, as the reference's
        fwd = plan.forward[0]
        fwd.hist_token_lens = [5]
        assert fwd.hist_token_lens == [5] and plan.forward[0].hist_token_lens == []
        reprs.append((repr(fwd), s.waiting_size(), s.prefilling_size(), s.available_kv_pages(), s.active_kv_pages()))
    assert reprs[0] == reprs[1]


def test_query_errors_match_the_reference(reference, ours):
    for ts in (reference, ours):
        s = ts.Scheduler(config(ts))
        assert s.paged_cache_group_ids() == []
        with pytest.raises(IndexError, match="group_id not configured"):
            s.paged_cache_group_total_pages("g")
        assert s.get_request_token_size("nobody") == -1
        assert s.calc_rolling_hash([1, 2, 3, 4, 5]) == reference.Scheduler(config(reference)).calc_rolling_hash([1, 2, 3, 4, 5])


def test_events_for_unknown_requests_and_ops_are_ignored_as_by_the_reference(ours):
    s = ours.Scheduler(config(ours))
    ev = ours.ExecutionEvent()
    for cls in (ours.ForwardEvent.Finish, ours.ForwardEvent.Abort):
        e = cls()
        e.request_id = "nobody"
        ev.add_event(e)
    done = ours.Cache.WriteBackDoneEvent()
    done.op_id = 99
    ev.add_event(done)
    s.advance(ev)  # no exception


def test_an_event_in_the_wrong_state_raises_runtime_error(reference, ours):
    for ts in (reference, ours):
        s = ts.Scheduler(config(ts))
        s.submit_requests([spec(ts, "A", list(range(1, 11)))])
        s.next_execution_plan()  # A's first chunk of 8: still Prefilling
        r = ts.ForwardEvent.ExtendResult()
        r.request_id = "A"
        r.tokens = [1]
        with pytest.raises(RuntimeError, match="FSM transition invalid"):
            s.advance(ts.ExecutionEvent().add_event(r))


# ---- differences on purpose (docs/python.md) ----------------------------------------


def test_kvtier_refuses_what_the_reference_accepts_silently(ours):
    s = ours.Scheduler(config(ours))
    s.submit_requests([spec(ours, "A", [1, 2, 3])])
    with pytest.raises(ValueError, match="already exists"):
        s.submit_requests([spec(ours, "A", [4, 5])])
    with pytest.raises(ValueError, match="empty prompt"):
        s.submit_requests([spec(ours, "E", [])])
    with pytest.raises(ValueError, match="device pages"):
        s.submit_requests([spec(ours, "L", list(range(1, 200)))])
    # The reference dies of SIGFPE on a zero page size once it plans.
    with pytest.raises(ValueError, match="page_size"):
        ours.Scheduler(config(ours, page_size=0))


def _finish_then_reuse(ts, success):
    """A finishes with L2 on; its write-back is acknowledged with `success`; C shares A's
    prefix. Returns C's first plan's (extend_prefix_len, load-back op count)."""
    s = ts.Scheduler(config(ts, max_scheduled_tokens=16))
    s.submit_requests([spec(ts, "A", list(range(100, 112)))])
    s.next_execution_plan()
    r = ts.ForwardEvent.ExtendResult()
    r.request_id, r.tokens = "A", [7]
    f = ts.ForwardEvent.Finish()
    f.request_id = "A"
    s.advance(ts.ExecutionEvent().add_event(r).add_event(f))
    plan = s.next_execution_plan()
    [wb] = [op for op in plan.cache if type(op).__name__ == "WriteBackOp"]
    ev = ts.ExecutionEvent()
    for op_id in wb.op_ids:
        d = ts.Cache.WriteBackDoneEvent()
        d.op_id, d.success = op_id, success
        ev.add_event(d)
    s.advance(ev)
    s.submit_requests([spec(ts, "C", list(range(100, 112)) + [9])])
    plan = s.next_execution_plan()
    loads = [op for op in plan.cache if type(op).__name__ == "LoadBackOp"]
    return plan.forward[0].extend_prefix_lens[0], len(loads)


def test_a_failed_write_back_keeps_the_device_copy(reference, ours):
    # Both: a successful write-back demotes the device copy; the prefix comes back from host.
    assert _finish_then_reuse(reference, True) == (12, 1)
    assert _finish_then_reuse(ours, True) == (12, 1)
    # The reference ignores `success`: the pages it never wrote are loaded back as KV.
    assert _finish_then_reuse(reference, False) == (12, 1)
    # kvtier keeps the device copy authoritative: a device hit, nothing read from host.
    assert _finish_then_reuse(ours, False) == (12, 0)


def test_import_tokenspeed_scheduler_gives_kvtier():
    code = (
        "import tokenspeed_scheduler, kvtier.compat;"
        "assert tokenspeed_scheduler.Scheduler is kvtier.compat.Scheduler;"
        "print(tokenspeed_scheduler.Scheduler.__module__)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd="/")
    assert out.returncode == 0, out.stderr


def test_with_l3_storage_written_back_pages_go_out_as_backups(ours):
    # kvtier serves the L3 tier the reference's 0.1.0 binds but never emits.
    s = ours.Scheduler(config(ours, enable_l3_storage=True, max_scheduled_tokens=16))
    prompt = list(range(100, 112))
    s.submit_requests([spec(ours, "A", prompt)])
    s.next_execution_plan()
    r = ours.ForwardEvent.ExtendResult()
    r.request_id, r.tokens = "A", [7]
    f = ours.ForwardEvent.Finish()
    f.request_id = "A"
    s.advance(ours.ExecutionEvent().add_event(r).add_event(f))
    [wb] = s.next_execution_plan().cache
    d = ours.Cache.WriteBackDoneEvent()
    d.op_id, d.success = wb.op_ids[0], True
    s.advance(ours.ExecutionEvent().add_event(d))
    [backup] = s.next_execution_plan().cache
    assert type(backup).__name__ == "BackUpOp"
    assert backup.src_pages == wb.dst_pages[0]
    assert backup.rolling_page_hashes == s.calc_rolling_hash(prompt)
    done = ours.Cache.BackUpDoneEvent()
    done.op_id, done.success = backup.op_id, True
    s.advance(ours.ExecutionEvent().add_event(done))
    plan = s.next_execution_plan()
    assert plan.cache == [] and plan.forward[0].request_ids == []

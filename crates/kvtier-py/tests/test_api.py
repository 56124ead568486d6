"""kvtier's own Python API: the actor system behind a handle, typed events and plans,
refusals as exceptions, and the trace tools."""

import pytest

import kvtier

PROMPT = list(range(100, 140))


def small_config(**overrides):
    fields = dict(page_size=4, device_pages=24, host_pages=64, max_scheduled_tokens=32,
                  max_batch_size=4, enable_kv_cache_events=True)
    fields.update(overrides)
    return kvtier.Config(**fields)


def drive(system, requests, generate=3, max_steps=500):
    """Runs `requests` to the end as an engine would; returns each plan's rows as
    tuples, for comparing runs."""
    system.submit(requests)
    produced = {r.id: 0 for r in requests}
    trace = []
    for _ in range(max_steps):
        plan = system.next_plan()
        if plan.is_empty() and all(n == generate for n in produced.values()):
            return trace
        trace.append([(r.request_id, r.kind, r.input_length, tuple(r.pages), r.begin, r.size) for r in plan.rows])
        events = [kvtier.WriteBackDone(op.op_id) for op in plan.write_backs]
        for row in plan.rows:
            if row.kind == "prefill" and row.extend_prefix_len + row.input_length < row.prefill_length:
                continue
            produced[row.request_id] += 1
            events.append(kvtier.ExtendResult(row.request_id, [5]))
            if produced[row.request_id] == generate:
                events.append(kvtier.Finish(row.request_id))
        system.advance(events)
    raise AssertionError("the requests did not finish")


def requests():
    # Shared prefixes, and more than the device holds at once: eviction, write-back.
    return [kvtier.Request(f"r{i}", PROMPT[: 20 + 4 * (i % 5)] + [i + 1] * 9) for i in range(12)]


def test_every_runtime_gives_the_same_plans_and_returns_every_page():
    traces = []
    for runtime in ("actix", "deterministic", "direct"):
        system = kvtier.System(small_config(host_pages=16), runtime=runtime)
        traces.append(drive(system, requests()))
        stats = system.stats()
        report = system.shutdown()
        assert report["conservation_ok"] and report["live_requests"] == [], report
        assert report["leased_host_pages"] == 0
        assert stats["hit_tokens_host"] > 0 and stats["evicted_host_pages"] > 0, stats
    assert traces[0] == traces[1] == traces[2]


def test_plans_carry_rows_copies_and_events_of_every_tier():
    with kvtier.System(small_config()) as system:
        system.submit([kvtier.Request("a", PROMPT)])
        plan = system.next_plan()
        [row] = plan.rows
        assert (row.kind, row.input_length, row.extend_prefix_len) == ("prefill", 32, 0)
        assert row.input_ids == PROMPT[:32] and row.shifted_input_ids == PROMPT[1:33]
        assert len(row.pages) == 9 and row.new_pages == row.pages  # 32 tokens + the decode reserve
        assert row.decode_input_id is None and row.mamba["working"] is None
        system.advance([])
        plan = system.next_plan()
        system.advance([kvtier.ExtendResult("a", [1]), kvtier.Finish("a")])
        plan = system.next_plan()
        [write_back] = plan.write_backs
        assert write_back.is_retract is False and len(write_back.src_pages) == 10
        assert all(kind == "kv" for kind, _, _ in write_back.pairs)
        system.advance([kvtier.WriteBackDone(write_back.op_id)])
        media = {(e.kind, e.medium) for e in system.kv_events()}
        assert ("BlockStored", "GPU") in media and ("BlockStored", "CPU") in media
        assert "kvtier_" in system.metrics_text() or "tokenspeed:" in system.metrics_text()


def test_refused_items_raise_with_their_index_and_the_others_apply():
    with kvtier.System(small_config()) as system:
        with pytest.raises(kvtier.RejectedError) as caught:
            system.submit([kvtier.Request("ok", [1, 2, 3]), ("empty", []), ("neg", [1, -2])])
        assert [i for i, _ in caught.value.rejected] == [1, 2]
        assert "empty prompt" in caught.value.rejected[0][1]
        assert system.stats()["waiting"] == 1
        with pytest.raises(kvtier.RejectedError, match="unknown"):
            system.advance([kvtier.Finish("nobody")])
        with pytest.raises(TypeError):
            system.advance(["not an event"])
    with pytest.raises(RuntimeError, match="shut down"):
        system.next_plan()


def test_configs_are_validated_with_the_field_named():
    with pytest.raises(ValueError, match="page_size"):
        kvtier.Config(device_pages=16, page_size=0)
    with pytest.raises(ValueError, match="device_pages"):
        kvtier.Config(device_pages=1)
    with pytest.raises(ValueError, match="policy"):
        kvtier.Config(device_pages=16, policy="fast")
    with pytest.raises(ValueError, match="runtime"):
        kvtier.System(small_config(), runtime="threads")
    hybrid = kvtier.Config(device_pages=64, page_size=4, host_pages=64, mamba=kvtier.Mamba(device_slots=8, chunk=4))
    assert hybrid.page_size == 4


def test_a_mamba_model_gets_state_slots_in_its_rows():
    config = kvtier.Config(device_pages=64, page_size=4, max_scheduled_tokens=16, max_batch_size=2,
                           mamba=kvtier.Mamba(device_slots=8, chunk=4))
    with kvtier.System(config, runtime="direct") as system:
        system.submit([kvtier.Request("m", PROMPT[:12])])
        [row] = system.next_plan().rows
        assert row.mamba["working"] is not None and row.mamba["checkpoint_dst"] is not None


def test_paged_groups_give_each_row_its_tables():
    groups = [kvtier.Group("full", rows_per_page=4, total_pages=64),
              kvtier.Group("swa", rows_per_page=4, total_pages=64, window=8)]
    config = kvtier.Config(device_pages=64, page_size=4, max_scheduled_tokens=16, max_batch_size=2,
                           groups=groups, required_groups=["full"])
    with kvtier.System(config, runtime="direct") as system:
        system.submit([kvtier.Request("p", PROMPT[:12])])
        [row] = system.next_plan().rows
        tables = row.group_tables
        assert set(tables) == {"full", "swa"}
        base, pages, _ = tables["full"]
        assert base == 0 and len(pages) >= 3


def test_trace_tools():
    trace = kvtier.read_trace(limit=5)
    assert len(trace) == 5 and trace[0].input_length > 0 and trace[0].hash_ids
    with pytest.raises(ValueError, match="reading the trace"):
        kvtier.read_trace("/nonexistent.jsonl")
    report = kvtier.replay(limit=12)
    assert report["finished"] == 12 and report["integrity_errors"] == 0
    assert report["hit_tokens"] <= report["ideal_hit_tokens"] <= report["prompt_tokens"]
    w2 = kvtier.run_workload("w2", requests=8)
    assert w2["finished"] == 8 and w2["prefill_rows"] == 8 and w2["retractions"] == 0
    with pytest.raises(ValueError, match="workload"):
        kvtier.run_workload("w9")


def test_the_type_stubs_describe_what_the_module_has():
    import ast
    import pathlib

    stub = pathlib.Path(kvtier.__file__).with_name("__init__.pyi")
    tree = ast.parse(stub.read_text())
    declared = {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    assert sorted(declared) == sorted(n for n in kvtier.__all__ if n != "__version__")
    for name, node in declared.items():
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(kvtier, name)
        members = {m.name for m in node.body if isinstance(m, ast.FunctionDef)}
        if not issubclass(cls, BaseException):  # an exception's fields are set when raised
            members |= {m.target.id for m in node.body if isinstance(m, ast.AnnAssign)}
        missing = sorted(m for m in members if not hasattr(cls, m))
        assert not missing, f"{name}: the stub declares {missing}, which the class lacks"

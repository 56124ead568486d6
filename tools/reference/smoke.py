#!/usr/bin/env python3
"""Minimal driver for tokenspeed_scheduler==0.1.0 (reference for kvtier's differential tests).

Two requests with a shared 8-token prefix are submitted together, then a third
request with the same prefix is submitted after both finished (to show the prefix
hit / L2 load-back path). The loop is: plan = next_execution_plan(); fake the
model; advance(ExecutionEvent with ExtendResult / Finish / WriteBackDone).
"""
import tokenspeed_scheduler as ts
from tokenspeed_scheduler import (Cache, ExecutionEvent, ForwardEvent, KVEvent,
                                  RequestSpec, Scheduler, SchedulerConfig)

MAX_NEW_TOKENS = 3

def spec(rid, toks):
    r = RequestSpec()
    r.request_id = rid
    r.tokens = toks          # list[int] (int32); the setter copies
    return r

def main():
    cfg = SchedulerConfig()          # every numeric default is 0 except noted in API.md
    cfg.page_size = 4
    cfg.num_device_pages = 16        # page 0 is reserved -> 15 usable
    cfg.num_host_pages = 16          # >= 2 -> L2 active (disable_l2_cache defaults False)
    cfg.max_scheduled_tokens = 8     # token budget per plan -> forces chunked prefill
    cfg.max_batch_size = 4           # request-pool slots 1..4
    cfg.enable_kv_cache_events = True
    s = Scheduler(cfg)

    prefix = [100, 101, 102, 103, 104, 105, 106, 107]
    s.submit_requests([spec("A", prefix + [1, 2]), spec("B", prefix + [3, 4, 5])])

    generated = {}                  # rid -> number of sampled tokens so far
    next_tok = 1000
    submitted_c = False
    for step in range(60):
        plan = s.next_execution_plan()
        fwd = plan.forward[0]        # always exactly one FlatForwardOp (possibly empty)
        print(f"--- step {step}: waiting={s.waiting_size()} prefilling={s.prefilling_size()} "
              f"decoding={s.decoding_size()} retracted={s.retract_count()} "
              f"avail_kv={s.available_kv_pages()} active_kv={s.active_kv_pages()}")
        if fwd.request_ids:
            print(f"  fwd rids={fwd.request_ids} pool={fwd.request_pool_indices} "
                  f"in_len={fwd.input_lengths} prefill_len={fwd.prefill_lengths} num_extends={fwd.num_extends()}")
            print(f"      occupied={fwd.occupied_pages} begins={fwd.begins} sizes={fwd.sizes} "
                  f"new={fwd.new_occupied_pages}")
            print(f"      input_ids={fwd.input_ids} shifted={fwd.shifted_input_ids} "
                  f"extend_prefix_lens={fwd.extend_prefix_lens}")
            print(f"      decode_input_ids={fwd.decode_input_ids} hist_token_lens={fwd.hist_token_lens} "
                  f"mamba_pool={fwd.mamba_pool_indices}")
        ev = ExecutionEvent()
        for op in plan.cache:        # list of Cache.WriteBackOp / Cache.LoadBackOp objects
            kind = type(op).__name__
            extra = f" is_retract={op.is_retract}" if isinstance(op, Cache.WriteBackOp) else ""
            print(f"  cache {kind}: op_ids={op.op_ids} src={op.src_pages} dst={op.dst_pages}"
                  f" by_kind_src={op.src_pages_by_kind}{extra}")
            if isinstance(op, Cache.WriteBackOp):
                for op_id in op.op_ids:          # one ack per op id
                    d = Cache.WriteBackDoneEvent()
                    d.op_id = op_id
                    d.success = True
                    ev.add_event(d)
            # LoadBackOp has no completion event in 0.1.0: fire-and-forget.
        n_ext = fwd.num_extends()
        for i, rid in enumerate(fwd.request_ids):
            is_prefill = i < n_ext   # prefill rows come first (stable partition)
            if is_prefill:
                done = fwd.extend_prefix_lens[i] + fwd.input_lengths[i] == fwd.prefill_lengths[i]
                if not done:
                    continue          # ExtendResult on a Prefilling request raises RuntimeError
            r = ForwardEvent.ExtendResult()
            r.request_id = rid
            r.tokens = [next_tok]
            next_tok += 1
            ev.add_event(r)
            generated[rid] = generated.get(rid, 0) + 1
            if generated[rid] >= MAX_NEW_TOKENS:
                f = ForwardEvent.Finish()
                f.request_id = rid
                ev.add_event(f)
        s.advance(ev)
        for kv in s.drain_kv_events():   # list of KVEvent.BlockStored / KVEvent.BlockRemoved
            if isinstance(kv, KVEvent.BlockStored):
                print(f"  kv {kv.kind}: hash={kv.block_hashes[0]:#x} parent="
                      f"{None if kv.parent_block_hash is None else hex(kv.parent_block_hash)} tokens={kv.token_ids}")
            else:
                print(f"  kv {kv.kind}: hashes={[hex(h) for h in kv.block_hashes]}")
        idle = (s.waiting_size() + s.prefilling_size() + s.decoding_size() + s.retract_count() == 0
                and not fwd.request_ids and not plan.cache)
        if idle and not submitted_c:
            print("  == submitting C (same 8-token prefix) after A and B finished")
            s.submit_requests([spec("C", prefix + [9])])
            submitted_c = True
        elif idle:
            print("  == idle")
            break
    print("rolling hashes of prefix:", [h[:12] for h in s.calc_rolling_hash(prefix)])
    print("final avail_kv", s.available_kv_pages(), "token size C", s.get_request_token_size("C"))

if __name__ == "__main__":
    main()

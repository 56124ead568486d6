"""A Python engine loop on kvtier (`cargo xtask py` runs it).

Eight users share a system prompt; each request generates a few tokens. The "model"
samples a token from the row's last input, so the loop shows only what an engine does
with a plan: run the copies, run the rows, report results, acknowledge write-backs.
"""

import kvtier

SYSTEM_PROMPT = list(range(1000, 1048))  # three 16-token pages
GENERATE = 4


def main():
    config = kvtier.Config(
        page_size=16,
        device_pages=64,
        host_pages=128,
        max_scheduled_tokens=96,
        max_batch_size=8,
        enable_kv_cache_events=True,
    )
    generated = {}
    with kvtier.System(config) as system:
        for user in range(8):
            request_id = f"user{user}"
            system.submit([kvtier.Request(request_id, SYSTEM_PROMPT + [user + 1] * 5)])
            generated[request_id] = 0
        while True:
            plan = system.next_plan()
            if plan.is_empty() and all(n == GENERATE for n in generated.values()):
                break
            events = [kvtier.WriteBackDone(op.op_id) for op in plan.write_backs]
            for row in plan.rows:
                # A prefill chunk short of the prompt's end samples nothing yet.
                if row.kind == "prefill" and row.extend_prefix_len + row.input_length < row.prefill_length:
                    continue
                generated[row.request_id] += 1
                events.append(kvtier.ExtendResult(row.request_id, [7]))
                if generated[row.request_id] == GENERATE:
                    events.append(kvtier.Finish(row.request_id))
            system.advance(events)
        stats = system.stats()
        stored = sum(1 for e in system.kv_events() if e.kind == "BlockStored")
    print(
        f"{len(generated)} requests, {stats['plans']} plans: {stats['hit_tokens']} of "
        f"{stats['prompt_tokens']} prompt tokens reused, {stored} pages published"
    )
    # The first step's budget (96 tokens) admits user0 and the start of user1, which
    # computes its own copy; the six users admitted later reuse the three shared pages.
    assert stats["hit_tokens"] == 6 * 48, stats


if __name__ == "__main__":
    main()

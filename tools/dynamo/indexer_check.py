#!/usr/bin/env python3
"""Dynamo's standalone KV indexer reads a kvtier replay's KV events; print its answers.

Run inside a private network namespace (the indexer's HTTP server binds every
interface): `unshare -n sh -c 'ip link set lo up && exec PYTHON indexer_check.py ...'`.

    indexer_check.py KVTIER REPORT.json ANSWERS.json -- REPLAY-ARGS...

1. starts `python -m dynamo.indexer` (the Python running this script must have
   ai-dynamo-runtime) on 127.0.0.1, and waits for /health;
2. registers kvtier as worker 1 of model "kvtier": its PUB endpoint and its ROUTER
   replay endpoint (batches the indexer missed while joining are replayed);
3. runs `KVTIER replay REPLAY-ARGS --kv-events ... --kv-events-replay ... --json
   REPORT.json` (REPLAY-ARGS should ask for --residency N);
4. waits until the indexer's answers settle, then asks it (POST /query) about every
   prompt of the report's `residency` and writes, per prompt, its request id and the
   indexer's `gpu`, `cpu` and `disk` token counts for the worker to ANSWERS.json.
"""
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

PORT = 18090
PUB = "tcp://127.0.0.1:15557"
REPLAY = "tcp://127.0.0.1:15558"
MODEL = "kvtier"
BLOCK_SIZE = 16


def http(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{PORT}{path}",
        data=data,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def wait_healthy(indexer, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if indexer.poll() is not None:
            sys.exit(f"the indexer exited with {indexer.returncode}")
        try:
            if http("GET", "/health")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit("the indexer did not become healthy")


def answers(prompts):
    out = []
    for request_id, tokens in prompts:
        status, body = http("POST", "/query", {"token_ids": tokens, "model_name": MODEL})
        if status != 200:
            sys.exit(f"/query answered {status}: {body}")
        worker = (body.get("instances") or {}).get("1") or {}
        out.append(
            {
                "request_id": request_id,
                "gpu": worker.get("gpu", 0),
                "cpu": worker.get("cpu", 0),
                "disk": worker.get("disk", 0),
            }
        )
    return out


def main():
    kvtier, report, answers_file, separator, *replay_args = sys.argv[1:]
    if separator != "--":
        sys.exit(__doc__)
    indexer = subprocess.Popen(
        [sys.executable, "-m", "dynamo.indexer", "--block-size", str(BLOCK_SIZE),
         "--port", str(PORT), "--threads", "1"],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_healthy(indexer)
        status, body = http("POST", "/register", {
            "instance_id": 1, "endpoint": PUB, "model_name": MODEL,
            "block_size": BLOCK_SIZE, "dp_rank": 0, "replay_endpoint": REPLAY,
        })
        if status not in (200, 201):
            sys.exit(f"/register answered {status}: {body}")
        subprocess.run(
            [kvtier, "replay", *replay_args, "--kv-events", PUB,
             "--kv-events-replay", REPLAY, "--json", report],
            check=True, stdout=subprocess.DEVNULL,
        )
        with open(report) as f:
            prompts = [(r["request_id"], r["token_ids"]) for r in json.load(f)["residency"]]
        # The last batches may still be on their way: ask until two rounds agree.
        last = None
        for _ in range(50):
            now = answers(prompts)
            if now == last:
                break
            last = now
            time.sleep(0.2)
        with open(answers_file, "w") as f:
            json.dump(last, f)
    finally:
        indexer.terminate()
        indexer.wait(timeout=30)


if __name__ == "__main__":
    main()

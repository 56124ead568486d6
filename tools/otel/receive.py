#!/usr/bin/env python3
"""Collect every OTLP/HTTP-protobuf span sent to 127.0.0.1:PORT (via oteltap 1.0.0) into a JSONL file.

Usage: receive.py PORT OUT.jsonl [--idle SECS] [--max SECS] [--sentinel SPAN_NAME]
                  [--metrics METRICS.jsonl]

With --metrics, the metrics exported to /v1/metrics are written too, one line per data
point (the last export of each series is the current value).

Prints "READY" on stdout once listening. Exits 0 when:
  * the sentinel span (if given) has been received and --idle seconds pass with no new span, or
  * --idle seconds pass with no new span after at least one span was received, or
  * --max seconds pass in total (hard cap; exits 0 too, even with zero spans - check the file).

How it uses oteltap:
  * oteltap's public API (stream_traces()/await_trace()) only fans spans out to subscribers that
    exist at the moment the span is polled; spans arriving with nobody subscribed are dropped.
    To avoid that race we skip OtelTapHttpProtobufReceiver entirely and call the native layer
    (oteltap.oteltap_core.OtelTapCore) directly: the native side queues every span in an
    unbounded mpsc channel until oteltap_poll_trace() drains it, so nothing is lost.
  * oteltap hands back bare `Span` protos: the Resource (service.name ...) and scope are
    discarded natively. To recover them we use oteltap's re-emit hook: the native receiver
    forwards the raw ExportTraceServiceRequest bytes to `reemit_traces_to`, which we point at a
    tiny in-process HTTP sink on an ephemeral loopback port. Resource attrs are joined by span_id.
"""
import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from oteltap.oteltap_core import OtelTapCore, OtelTapFlags


def any_value(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attrs(kvs):
    return {kv.key: any_value(kv.value) for kv in kvs}


def metric_points(m):
    """One JSON object per data point of a Metric proto."""
    kind = m.WhichOneof("data")
    data = getattr(m, kind) if kind else None
    for p in (data.data_points if data is not None else []):
        line = {"name": m.name, "unit": m.unit, "type": kind, "attributes": attrs(p.attributes),
                "time_ns": p.time_unix_nano}
        if kind == "histogram":
            line.update(count=p.count, sum=p.sum, bounds=list(p.explicit_bounds),
                        bucket_counts=list(p.bucket_counts))
        else:
            line["value"] = p.as_int if p.WhichOneof("value") == "as_int" else p.as_double
        if kind == "sum":
            line["monotonic"] = data.is_monotonic
        yield line


STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}
KIND = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("out")
    ap.add_argument("--idle", type=float, default=3.0, help="exit after this many seconds without a new span")
    ap.add_argument("--max", type=float, default=120.0, help="hard cap on total run time")
    ap.add_argument("--sentinel", default=None, help="span name; once seen, exit after --idle quiet seconds")
    ap.add_argument("--metrics", default=None, help="also write the metrics received to this file")
    a = ap.parse_args()

    lock = threading.Lock()
    resource_by_span = {}  # span_id hex -> (resource attrs, scope name, scope version)

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            req = ExportTraceServiceRequest.FromString(body)
            with lock:
                for rs in req.resource_spans:
                    r = attrs(rs.resource.attributes)
                    for ss in rs.scope_spans:
                        for sp in ss.spans:
                            resource_by_span[sp.span_id.hex()] = (r, ss.scope.name, ss.scope.version)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    sink = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    sink_url = f"http://127.0.0.1:{sink.server_address[1]}/v1/traces"

    status, handle = OtelTapCore.oteltap_start_receiving_http_protobuf(
        a.port, OtelTapFlags.NONE, sink_url, None, None)  # NONE => loopback only
    if status < 0:
        print(f"oteltap start failed: {status} (port in use?)", file=sys.stderr)
        return 2
    print("READY", flush=True)

    spans = []
    metrics = []
    t0 = time.monotonic()
    last_new = None
    sentinel_seen = False
    while True:
        if a.metrics:
            while True:
                mrc, mdata = OtelTapCore.oteltap_poll_metric(handle, 0)
                if mrc < 0 or mdata is None:
                    break
                metrics.append(Metric.FromString(mdata))
        rc, data = OtelTapCore.oteltap_poll_trace(handle, 200)
        now = time.monotonic()
        if rc < 0:
            print(f"poll failed: {rc}", file=sys.stderr)
            break
        if data is not None:
            sp = Span.FromString(data)
            spans.append(sp)
            last_new = now
            if a.sentinel and sp.name == a.sentinel:
                sentinel_seen = True
            continue
        if now - t0 > a.max:
            print(f"hard timeout after {a.max}s", file=sys.stderr)
            break
        if last_new is not None and now - last_new > a.idle and (sentinel_seen or not a.sentinel or now - last_new > 4 * a.idle):
            break

    time.sleep(0.3)  # re-emit is fire-and-forget on the native side; let the last one land
    OtelTapCore.oteltap_stop_receiving(handle)
    sink.shutdown()

    with open(a.out, "w") as f:
        for sp in spans:
            sid = sp.span_id.hex()
            res, scope, scope_ver = resource_by_span.get(sid, ({}, None, None))
            f.write(json.dumps({
                "trace_id": sp.trace_id.hex(),
                "span_id": sid,
                "parent_span_id": sp.parent_span_id.hex() or None,
                "name": sp.name,
                "kind": KIND.get(sp.kind, sp.kind),
                "start_ns": sp.start_time_unix_nano,
                "end_ns": sp.end_time_unix_nano,
                "attributes": attrs(sp.attributes),
                "events": [{"name": e.name, "time_ns": e.time_unix_nano, "attributes": attrs(e.attributes)} for e in sp.events],
                "status": {"code": STATUS.get(sp.status.code, sp.status.code), "message": sp.status.message},
                "resource": res,
                "scope": scope,
            }, sort_keys=True) + "\n")
    if a.metrics:
        with open(a.metrics, "w") as f:
            for m in metrics:
                for line in metric_points(m):
                    f.write(json.dumps(line, sort_keys=True) + "\n")
    print(f"wrote {len(spans)} spans ({len({s.trace_id for s in spans})} traces) to {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

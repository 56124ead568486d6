"""Loaded at Python start-up when this directory is on PYTHONPATH (`cargo xtask
dashboards` puts it there for Arize Phoenix only).

Phoenix's OTLP gRPC receiver binds every interface ("[::]:PORT") and has no setting for
the address; this makes a gRPC asyncio server's insecure ports bind loopback instead, so
that the whole trace UI listens on 127.0.0.1 alone.
"""

try:
    import grpc.aio
except ImportError:  # not Phoenix's venv: nothing to do
    grpc = None

if grpc is not None:
    _make_server = grpc.aio.server

    def _loopback_server(*args, **kwargs):
        server = _make_server(*args, **kwargs)
        add_port = server.add_insecure_port

        def add_insecure_port(address):
            host, _, port = address.rpartition(":")
            if host in ("[::]", "0.0.0.0", ""):
                address = f"127.0.0.1:{port}"
            return add_port(address)

        server.add_insecure_port = add_insecure_port
        return server

    grpc.aio.server = _loopback_server

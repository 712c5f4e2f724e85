"""A small Python client for gpuprofd's gRPC API (package gpuprof.v1).

The protocol code is generated from the repository's ``proto/gpuprof/v1/gpuprof.proto``
with grpcio-tools (``generate``), so it always matches the daemon it ships with::

    import gpuprofclient
    gpuprofclient.generate("/tmp/gpuprof-gen")          # once; adds it to sys.path
    c = gpuprofclient.Client("/run/gpuprof/api.sock")
    s = c.start_session(pids=[1234], duration_ms=10_000)
    print(c.get_session(s.id).state)

Needs ``pip install grpcio grpcio-tools``.
"""

import importlib
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.normpath(os.path.join(_HERE, "..", "..", "..", "proto"))
PROTO = os.path.join("gpuprof", "v1", "gpuprof.proto")

pb = None
rpc = None


def generate(out_dir, proto_root=PROTO_ROOT):
    """Generates gpuprof_pb2 / gpuprof_pb2_grpc into out_dir and imports them."""
    global pb, rpc
    from grpc_tools import protoc

    os.makedirs(out_dir, exist_ok=True)
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            "-I" + proto_root,
            "-I" + include,
            "--python_out=" + out_dir,
            "--grpc_python_out=" + out_dir,
            os.path.join(proto_root, PROTO),
        ]
    )
    if rc != 0:
        raise RuntimeError("protoc failed on %s (exit %d)" % (os.path.join(proto_root, PROTO), rc))
    if out_dir not in sys.path:
        sys.path.insert(0, out_dir)
    pb = importlib.import_module("gpuprof.v1.gpuprof_pb2")
    rpc = importlib.import_module("gpuprof.v1.gpuprof_pb2_grpc")
    return pb, rpc


def state_name(state):
    """'active', 'completed', ... for a SessionState value."""
    return pb.SessionState.Name(state).replace("SESSION_STATE_", "").lower()


class Client:
    """Blocking client on the daemon's api Unix socket."""

    def __init__(self, socket_path="/run/gpuprof/api.sock", timeout=30.0):
        import grpc

        if pb is None:
            raise RuntimeError("call gpuprofclient.generate(dir) first")
        self.timeout = timeout
        # No channel options needed: gpuprofd accepts the socket path gRPC sends as :authority.
        self.channel = grpc.insecure_channel("unix:" + socket_path)
        self.stub = rpc.GpuprofStub(self.channel)

    def close(self):
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def status(self):
        return self.stub.GetStatus(pb.GetStatusRequest(), timeout=self.timeout)

    def start_session(self, pids=(), exe_names=(), patterns=(), cgroups=(), all_processes=False, name="",
                      preset="default", duration_ms=0, max_records=0, start_at_ns=0):
        targets = [pb.Target(pid=p) for p in pids]
        targets += [pb.Target(exe_name=e) for e in exe_names]
        targets += [pb.Target(exe_pattern=p) for p in patterns]
        targets += [pb.Target(cgroup=c) for c in cgroups]
        if all_processes:
            targets.append(pb.Target(all=True))
        req = pb.StartSessionRequest(
            name=name,
            targets=targets,
            collect=pb.CollectOptions(preset=preset),
            duration_ms=duration_ms,
            max_records=max_records,
            start_at_ns=start_at_ns,
        )
        return self.stub.StartSession(req, timeout=self.timeout)

    def stop_session(self, session_id):
        return self.stub.StopSession(pb.StopSessionRequest(session_id=session_id), timeout=self.timeout)

    def get_session(self, session_id):
        return self.stub.GetSession(pb.GetSessionRequest(session_id=session_id), timeout=self.timeout)

    def list_sessions(self, states=(), name_contains=""):
        """All sessions (newest first), following pages."""
        out, token = [], ""
        while True:
            r = self.stub.ListSessions(
                pb.ListSessionsRequest(states=list(states), name_contains=name_contains, page_token=token, page_size=100),
                timeout=self.timeout,
            )
            out.extend(r.sessions)
            token = r.next_page_token
            if not token:
                return out

    def summary(self, session_id, top=20):
        return self.stub.GetSummary(pb.GetSummaryRequest(session_id=session_id, top=top), timeout=self.timeout)

    def kernels(self, session_id, name_pattern="", limit=0):
        """Kernel records of a session, as they stream."""
        req = pb.QueryRecordsRequest(
            session_id=session_id, kinds=["kernel"], filter=pb.RecordFilter(name_pattern=name_pattern), limit=limit
        )
        for chunk in self.stub.QueryRecords(req, timeout=self.timeout):
            for k in chunk.kernels:
                yield k

    def export_chrome(self, session_id, path):
        """Writes a Chrome trace JSON; returns the number of events."""
        events = 0
        with open(path, "wb") as f:
            req = pb.ExportTraceRequest(session_id=session_id, format=pb.EXPORT_FORMAT_CHROME_JSON)
            for chunk in self.stub.ExportTrace(req, timeout=self.timeout):
                f.write(chunk.data)
                events = max(events, chunk.events_written)
        return events

"""Python client of gpuprofd (gRPC API ``gpuprof.v1``) on its Unix socket.

::

    import gpuprof

    with gpuprof.Client() as c:
        print(c.status().version)
        for k in c.query(7, kinds=["kernel"]):
            print(k.name)

Calls raise ``grpc.RpcError``; its ``code()`` is the gRPC status gpuprofd chose (NOT_FOUND,
INVALID_ARGUMENT, PERMISSION_DENIED, ...) and ``details()`` says what to do.
"""

from __future__ import annotations

import os
from typing import Iterable, Iterator, List, Optional, Union

import grpc

from gpuprof.v1 import gpuprof_pb2 as pb
from gpuprof.v1 import gpuprof_pb2_grpc as rpc

__all__ = ["Client", "DEFAULT_SOCKET", "Record", "pb", "rpc", "state_name"]

#: The API socket of a system-wide gpuprofd.
DEFAULT_SOCKET = "/run/gpuprof/api.sock"

#: One record from :meth:`Client.query`.
Record = Union[pb.KernelRow, pb.MemcpyRow, pb.MemsetRow, pb.ApiRow, pb.SyncRow, pb.MarkerRow]


def state_name(state: int) -> str:
    """'active', 'completed', ... for a ``SessionState`` value."""
    return pb.SessionState.Name(state).replace("SESSION_STATE_", "").lower()


class Client:
    """A blocking client on gpuprofd's api socket.

    ``socket``: the socket path; default ``$GPUPROF_API_SOCKET``, else :data:`DEFAULT_SOCKET`.
    ``timeout``: seconds each call may take (streams: the whole stream).
    """

    def __init__(self, socket: Optional[str] = None, timeout: float = 30.0) -> None:
        path = socket or os.environ.get("GPUPROF_API_SOCKET") or DEFAULT_SOCKET
        self.socket = os.path.abspath(path)
        self.timeout = timeout
        self.channel = grpc.insecure_channel("unix://" + self.socket)
        self.stub = rpc.GpuprofStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def status(self) -> pb.GetStatusResponse:
        """Version, uptime, agents, records per kind, database size."""
        return self.stub.GetStatus(pb.GetStatusRequest(), timeout=self.timeout)

    def sessions(self, states: Iterable[int] = (), name_contains: str = "") -> List[pb.Session]:
        """All sessions the caller may see, newest first (every page)."""
        out: List[pb.Session] = []
        token = ""
        while True:
            req = pb.ListSessionsRequest(
                states=list(states), name_contains=name_contains, page_size=500, page_token=token
            )
            r = self.stub.ListSessions(req, timeout=self.timeout)
            out.extend(r.sessions)
            token = r.next_page_token
            if not token:
                return out

    def session(self, session_id: int) -> pb.Session:
        return self.stub.GetSession(pb.GetSessionRequest(session_id=session_id), timeout=self.timeout)

    def start_session(
        self,
        *,
        pids: Iterable[int] = (),
        exe_names: Iterable[str] = (),
        patterns: Iterable[str] = (),
        cgroups: Iterable[str] = (),
        all_processes: bool = False,
        job: str = "",
        ranks: Iterable[int] = (),
        name: str = "",
        preset: str = "default",
        duration_ms: int = 0,
        max_records: int = 0,
        pc_sampling: bool = False,
        pc_period_log2: int = 0,
        pm_rate_hz: int = 0,
    ) -> pb.Session:
        """Starts a session over the processes that match any of the targets.

        ``pc_sampling`` samples the processes' warp PCs continuously (every 2^``pc_period_log2``
        SM cycles, 0: the daemon's default); ``preset="pc"`` collects nothing else.
        ``pm_rate_hz`` runs CUPTI PM sampling on every GPU at that rate while the session is
        active (operators only; at most 10000).
        ``job`` covers the processes of a distributed job (TORCHELASTIC_RUN_ID or SLURM_JOB_ID),
        ``ranks`` only those of its global ranks.
        """
        targets = [pb.Target(pid=p) for p in pids]
        targets += [pb.Target(exe_name=e) for e in exe_names]
        targets += [pb.Target(exe_pattern=p) for p in patterns]
        targets += [pb.Target(cgroup=c) for c in cgroups]
        if all_processes:
            targets.append(pb.Target(all=True))
        ranks = list(ranks)
        if ranks and not job:
            raise ValueError("ranks narrow a job: give job too")
        if job:
            targets.append(pb.Target(job=pb.JobTarget(job_id=job, ranks=ranks)))
        req = pb.StartSessionRequest(
            name=name,
            targets=targets,
            collect=pb.CollectOptions(
                preset=preset,
                pc_sampling=pc_sampling,
                pc_sampling_period_log2=pc_period_log2,
                pm_sampling_rate_hz=pm_rate_hz,
            ),
            duration_ms=duration_ms,
            max_records=max_records,
        )
        return self.stub.StartSession(req, timeout=self.timeout)

    def stop_session(self, session_id: int) -> pb.Session:
        """Stops a session once its processes have flushed; returns it as it ended."""
        return self.stub.StopSession(pb.StopSessionRequest(session_id=session_id), timeout=self.timeout)

    def summary(self, session_id: int, top: int = 20) -> pb.GetSummaryResponse:
        """Top kernels, device busy time, copies and API calls of a session."""
        return self.stub.GetSummary(pb.GetSummaryRequest(session_id=session_id, top=top), timeout=self.timeout)

    def job_summary(self, session_id: int, job: str = "") -> pb.JobSummary:
        """A distributed job's ranks in a session compared: step time, GPU busy share, NCCL time,
        time waiting in collectives, and the straggler (``job`` "": the session's one job)."""
        req = pb.GetJobSummaryRequest(session_id=session_id, job_id=job)
        return self.stub.GetJobSummary(req, timeout=self.timeout)

    def pc_top(
        self, session_id: int, group_by: str = "function", kernel: str = "", limit: int = 20
    ) -> pb.QueryPcSamplesResponse:
        """A session's PC samples, hottest first, grouped by "function", "line", "stall" or "pc".

        ``kernel`` is a glob over function names (demangled or as reported); each row carries its
        samples by stall reason.
        """
        groups = {
            "function": pb.PC_GROUP_BY_FUNCTION,
            "line": pb.PC_GROUP_BY_LINE,
            "stall": pb.PC_GROUP_BY_STALL,
            "pc": pb.PC_GROUP_BY_PC,
        }
        if group_by not in groups:
            raise ValueError(f"group_by {group_by!r}: use one of {', '.join(groups)}")
        req = pb.QueryPcSamplesRequest(session_id=session_id, group_by=groups[group_by], kernel=kernel, limit=limit)
        return self.stub.QueryPcSamples(req, timeout=self.timeout)

    def diff(
        self,
        a: int,
        b: int = 0,
        *,
        rank_a: Optional[int] = None,
        rank_b: Optional[int] = None,
        since_a_ns: int = 0,
        until_a_ns: int = 0,
        since_b_ns: int = 0,
        until_b_ns: int = 0,
        limit: int = 0,
        by_shape: bool = False,
    ) -> pb.DiffSummaryResponse:
        """What changed between session ``a`` and session ``b`` (0: ``a`` again, for two ranks or
        time ranges of one session): per kernel, device busy time, copies, NCCL collectives.

        Kernels come findings first (``significant``), by the absolute change in GPU time; a
        kernel whose mean moved within the spread of its own durations is "unchanged" (the
        response's ``noise_rule`` says how that is judged). ``rank_a``/``rank_b`` pick one rank of
        the session's job; ``since_*_ns``/``until_*_ns`` a time range (ns since the Unix epoch);
        ``by_shape`` matches kernels by name and launch shape (grid, block).
        """
        req = pb.DiffSummaryRequest(
            a=_side(a, rank_a, since_a_ns, until_a_ns),
            b=_side(b or a, rank_b, since_b_ns, until_b_ns),
            limit=limit,
            by_shape=by_shape,
        )
        return self.stub.DiffSummary(req, timeout=self.timeout)

    def pc_diff(
        self,
        a: int = 0,
        b: int = 0,
        *,
        group_by: str = "function",
        kernel: str = "",
        rank_a: Optional[int] = None,
        rank_b: Optional[int] = None,
        since_a_ns: int = 0,
        until_a_ns: int = 0,
        since_b_ns: int = 0,
        until_b_ns: int = 0,
        pod: str = "",
        exe: str = "",
        limit: int = 20,
    ) -> pb.DiffPcSamplesResponse:
        """What changed in the PC samples of two sides, per "function", "line" or "stall", as
        shares of each side's samples (a row counts only beyond its sampling noise: see the
        response's ``noise_rule``).

        A side is a session (``a``, ``b``; ``b`` 0: ``a`` again, with ranks), or with session 0 the
        node's always-on profile from ``since_*_ns`` to ``until_*_ns``, of the processes ``pod`` and
        ``exe`` (globs) match.
        """
        groups = {"function": pb.PC_GROUP_BY_FUNCTION, "line": pb.PC_GROUP_BY_LINE, "stall": pb.PC_GROUP_BY_STALL}
        if group_by not in groups:
            raise ValueError(f"group_by {group_by!r}: use one of {', '.join(groups)}")
        sb = b or (a if not since_b_ns else 0)
        req = pb.DiffPcSamplesRequest(
            a=_side(a, rank_a, since_a_ns, until_a_ns, pod, exe),
            b=_side(sb, rank_b, since_b_ns, until_b_ns, pod, exe),
            group_by=groups[group_by],
            kernel=kernel,
            limit=limit,
        )
        return self.stub.DiffPcSamples(req, timeout=self.timeout)

    def query(
        self,
        session_id: int,
        kinds: Iterable[str] = ("kernel",),
        name_pattern: str = "",
        limit: int = 0,
    ) -> Iterator[Record]:
        """A session's records as they stream: kernel, memcpy, memset, api, sync, marker rows.

        ``name_pattern`` is a glob over kernel names (demangled or as reported); ``limit`` 0: all.
        """
        req = pb.QueryRecordsRequest(
            session_id=session_id, kinds=list(kinds), filter=pb.RecordFilter(name_pattern=name_pattern), limit=limit
        )
        for chunk in self.stub.QueryRecords(req, timeout=self.timeout):
            yield from chunk.kernels
            yield from chunk.memcpys
            yield from chunk.memsets
            yield from chunk.api_calls
            yield from chunk.syncs
            yield from chunk.markers


def _side(
    session_id: int, rank: Optional[int], since_ns: int, until_ns: int, pod: str = "", exe: str = ""
) -> pb.DiffSide:
    """One side of a diff; pod and exe apply to the always-on profile (session 0) only."""
    side = pb.DiffSide(session_id=session_id, since_ns=since_ns, until_ns=until_ns)
    if rank is not None:
        side.rank = rank
    if session_id == 0:
        side.pod, side.exe = pod, exe
    return side

"""Reads a `gpuprofctl export --format parquet` directory back with DuckDB and prints one JSON
object: the rows of each file, the top kernels by total time (name, launches, total ns), the
kernels whose end_ns - start_ns differs from duration_ns, the column names of each file, and
each file's distinct (process_id, job_id, rank).

Usage: python3 parquet_check.py DIR
"""

import json
import os
import sys

import duckdb


def main() -> None:
    d = sys.argv[1]
    con = duckdb.connect()
    files = sorted(f for f in os.listdir(d) if f.endswith(".parquet"))
    rows = {}
    columns = {}
    ranks = {}
    for f in files:
        path = os.path.join(d, f)
        kind = f[: -len(".parquet")]
        rows[kind] = con.execute("SELECT count(*) FROM read_parquet(?)", [path]).fetchone()[0]
        columns[kind] = [r[0] for r in con.execute("DESCRIBE SELECT * FROM read_parquet(?)", [path]).fetchall()]
        ranks[kind] = [
            list(r)
            for r in con.execute(
                "SELECT DISTINCT process_id, job_id, rank FROM read_parquet(?) ORDER BY process_id", [path]
            ).fetchall()
        ]
    top = []
    bad_times = None
    if "kernel" in rows:
        path = os.path.join(d, "kernel.parquet")
        top = [
            {"name": n, "count": c, "total_ns": int(t)}
            for n, c, t in con.execute(
                "SELECT name, count(*) AS launches, sum(duration_ns) AS total FROM read_parquet(?) "
                "GROUP BY name ORDER BY total DESC, name",
                [path],
            ).fetchall()
        ]
        bad_times = con.execute(
            "SELECT count(*) FROM read_parquet(?) WHERE end_ns - start_ns <> duration_ns", [path]
        ).fetchone()[0]
    print(json.dumps({"rows": rows, "top_kernels": top, "kernel_bad_times": bad_times, "columns": columns,
                      "ranks": ranks}))


if __name__ == "__main__":
    main()

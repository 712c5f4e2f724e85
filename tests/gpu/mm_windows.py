"""Throughput of a GPU-bound PyTorch matmul loop in time windows, for slowdown measurements that
compare windows of one long-running process instead of separate runs (no start-up variance, and
drift cancels when each window is compared with its neighbours).

  mm_windows.py run LOG STOP_FILE [MAX_SECONDS]
      8192x8192 matmuls (bf16, or MM_DTYPE=float32) in batches of 10, appending "unix_time
      cumulative_matmuls" to LOG after each batch, until STOP_FILE exists (or MAX_SECONDS pass).
  mm_windows.py analyze LOG WINDOWS [GPU_LOG]
      WINDOWS has lines "LABEL T0 T1" (unix times); label "off" is the baseline. For every other
      window, its rate is compared with the mean rate of the nearest "off" window before it and
      the nearest after it. Prints one line per label: the median slowdown in %, the mean and
      its standard error, and the windows' rates. With GPU_LOG (lines "unix_time sm_clock_mhz
      power_w"), also the mean SM clock and power draw over each label's windows.
"""
import os
import statistics as st
import sys
import time


def run(log, stop, max_s):
    import torch

    n = 8192
    dtype = getattr(torch, os.environ.get("MM_DTYPE", "bfloat16"))
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
    done, t_end = 0, time.time() + max_s
    with open(log, "w", buffering=1) as f:
        f.write(f"{time.time():.6f} 0\n")
        while not os.path.exists(stop) and time.time() < t_end:
            for _ in range(10):
                c = a @ b
            torch.cuda.synchronize()
            done += 10
            f.write(f"{time.time():.6f} {done}\n")
    del c


def count_at(points, t):
    """Cumulative matmuls at time t, interpolated between the logged points."""
    lo, hi = 0, len(points) - 1
    if t <= points[0][0] or t >= points[-1][0]:
        raise ValueError(f"time {t} outside the log")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if points[mid][0] <= t:
            lo = mid
        else:
            hi = mid
    (t0, c0), (t1, c1) = points[lo], points[hi]
    return c0 + (c1 - c0) * (t - t0) / (t1 - t0)


def gpu_means(gpu_log, wins_t):
    """Mean SM clock and power over the samples inside the given (t0, t1) windows."""
    rows = []
    for l in open(gpu_log):
        p = l.replace(",", " ").split()
        try:
            rows.append((float(p[0]), float(p[1]), float(p[2])))
        except (ValueError, IndexError):
            continue
    inside = [(c, w) for t, c, w in rows if any(t0 <= t <= t1 for t0, t1 in wins_t)]
    if not inside:
        return "no GPU samples"
    return f"SM clock {st.mean(c for c, _ in inside):.0f} MHz, power {st.mean(w for _, w in inside):.1f} W ({len(inside)} samples)"


def analyze(log, windows, gpu_log=None):
    points = [tuple(map(float, l.split())) for l in open(log) if l.strip()]
    wins, spans = [], {}
    for l in open(windows):
        if l.strip():
            label, t0, t1 = l.split()
            t0, t1 = float(t0), float(t1)
            wins.append((label, (count_at(points, t1) - count_at(points, t0)) / (t1 - t0)))
            spans.setdefault(label, []).append((t0, t1))
    offs = [r for lab, r in wins if lab == "off"]
    print(f"off: {len(offs)} windows, median {st.median(offs):.2f} matmul/s, rates {[round(r, 2) for r in offs]}")
    if gpu_log:
        for lab, sp in spans.items():
            print(f"gpu {lab}: {gpu_means(gpu_log, sp)}")
    per = {}
    for i, (lab, r) in enumerate(wins):
        if lab == "off":
            continue
        before = next((w[1] for w in reversed(wins[:i]) if w[0] == "off"), None)
        after = next((w[1] for w in wins[i + 1 :] if w[0] == "off"), None)
        ref = [x for x in (before, after) if x is not None]
        if ref:
            base = sum(ref) / len(ref)
            per.setdefault(lab, []).append(((base - r) / base * 100, r))
    for lab, v in per.items():
        s = [x for x, _ in v]
        sem = st.stdev(s) / len(s) ** 0.5 if len(s) > 1 else float("nan")
        print(f"{lab}: slowdown median {st.median(s):.3f} % mean {st.mean(s):.3f} % sem {sem:.3f} % "
              f"over {len(s)} windows; rates {[round(r, 2) for _, r in v]}")


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3], float(sys.argv[4]) if len(sys.argv) > 4 else 600)
    else:
        analyze(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)

#!/usr/bin/python3
"""Figures of one bench/compare run, drawn from its compare.json.

    /usr/bin/python3 bench/plots.py OUT/compare.json [--out DIR]

Writes, as PNG and SVG (matplotlib from Debian's python3-matplotlib):

  decode_vs_context   time per generated token against context length, log
                      axes: PyTorch softmax attention reading its KV cache,
                      and linattn's linear decode step (one session, H = 8)
                      with the per-token times decode_flatness measured at
                      its positions, in process and through the server
  server_sessions     server decode at 1…64 sessions (one Decode stream per
                      session, loopback TCP): steps/s and p99 latency,
                      beside the in-process batched step at 64
  prefill_vs_tokens   prefill tokens/s against prompt length T, log axes:
                      linattn's chunkwise prefill, the PyTorch chunkwise
                      peer and PyTorch causal softmax attention

bench/compare calls this after writing compare.json; every point is a
measurement of that run, nothing is fitted or extrapolated.
"""

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

FIGURES = ("decode_vs_context", "server_sessions", "prefill_vs_tokens")
COLORS = {64: "tab:blue", 128: "tab:orange"}


def _save(fig, out, name):
    paths = []
    for ext in ("png", "svg"):
        path = os.path.join(out, f"{name}.{ext}")
        # No timestamps in the SVG, so reruns differ only where numbers do.
        fig.savefig(path, dpi=110, metadata={"Date": None} if ext == "svg" else None)
        paths.append(path)
    plt.close(fig)
    return paths


def _finish(fig, res, out, name):
    """The run's machine and date under the figure, then the files."""
    m = res.get("machine", {})
    fig.text(0.01, 0.01, f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores · "
             f"{res.get('date', '')}" + (" · --quick" if res.get("quick") else ""),
             fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return _save(fig, out, name)


def decode_vs_context(res, out):
    peers = [p for p in res["peers"]["rows"] if p["op"] == "softmax_kv_decode"]
    decode = res["attention"]["decode"]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for d in sorted({p["d"] for p in peers}):
        pts = sorted((p["context"], p["seconds"]) for p in peers if p["d"] == d)
        ax.plot([c for c, _ in pts], [s * 1e6 for _, s in pts], "o-", color=COLORS.get(d),
                label=f"PyTorch softmax, KV cache (d = {d})")
        step = decode.get(f"{d}/1")
        if step:
            # The step does not read the context: one measurement, drawn
            # across the contexts the softmax peer was measured at.
            ax.hlines(step["seconds"] * 1e6, pts[0][0], pts[-1][0], colors=COLORS.get(d),
                      linestyles="--", label=f"linattn linear step, any context (d = {d})")
    for flat, label, marker in (
            (res["flatness_in_process"], "linattn at its position, in process", "s"),
            (res["server"]["flatness"], "linattn at its position, through the server", "^")):
        pts = [(p["position"], p["seconds_per_token"]) for p in flat["points"]]
        ax.plot([c for c, _ in pts], [s * 1e6 for _, s in pts], marker, color="tab:green",
                linestyle=":", label=label + " (d = 64)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("time per token, one session, H = 8 (µs)")
    ax.set_title("Decode time per token against context", fontsize=11)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper left")
    return _finish(fig, res, out, "decode_vs_context")


def server_sessions(res, out):
    sweep = res["server"]["sessions"]
    ns = sorted(int(n) for n in sweep)
    rate = [sweep[str(n)]["steps_per_second"] for n in ns]
    p99 = [sweep[str(n)]["latency_us"]["p99"] / 1e3 for n in ns]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4))
    left.plot(ns, rate, "o-", color="tab:blue", label="server, one Decode stream per session")
    batch = res["server"].get("decode_64_batch16")
    if batch:
        left.plot([64], [batch["steps_per_second"]], "D", color="tab:purple",
                  label="server, DecodeBatch of 16, 64 sessions")
    engine = res["attention"]["decode"].get("64/64")
    if engine:
        left.plot([64], [64 / engine["seconds"]], "*", markersize=11, color="tab:red",
                  label="in-process batched step, 64 sessions")
    left.set_yscale("log")
    left.set_ylabel("session steps/s (H = 8, d = 64)")
    right.plot(ns, p99, "o-", color="tab:orange")
    right.set_ylabel("p99 step latency (ms)")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns)
        ax.set_xticklabels([str(n) for n in ns])
        ax.set_xlabel("concurrent sessions")
        ax.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=7.5)
    fig.suptitle("Server decode against sessions (loopback TCP, client on the same cores)",
                 fontsize=11)
    return _finish(fig, res, out, "server_sessions")


def prefill_vs_tokens(res, out):
    chunk = res["attention"]["chunkwise"].values()
    peers = res["peers"]["rows"]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for d in sorted({c["d"] for c in chunk}):
        series = (
            ("linattn chunkwise", "o-",
             [(c["tokens"], c["tokens_per_s"]) for c in chunk if c["d"] == d]),
            ("PyTorch chunkwise", "s--",
             [(p["tokens"], p["tokens_per_s"]) for p in peers
              if p["op"] == "chunkwise" and p["d"] == d]),
            ("PyTorch causal softmax", "^:",
             [(p["tokens"], p["tokens_per_s"]) for p in peers
              if p["op"] == "softmax_causal_prefill" and p["d"] == d]))
        for label, style, pts in series:
            pts.sort()
            if pts:
                ax.plot([t for t, _ in pts], [r for _, r in pts], style, color=COLORS.get(d),
                        label=f"{label} (d = {d})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prompt length T (tokens, one session, H = 8)")
    ax.set_ylabel("prefill tokens/s")
    ax.set_title("Prefill throughput against prompt length", fontsize=11)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7.5)
    return _finish(fig, res, out, "prefill_vs_tokens")


def write_all(res, out, log=lambda msg: print(msg, file=sys.stderr)):
    """Every figure of `res` (compare.json's results) into `out`; the paths.
    A figure whose measurements the run does not hold (a compare.json from
    before they were taken) is skipped with a message."""
    os.makedirs(out, exist_ok=True)
    paths = []
    for name in FIGURES:
        try:
            paths += globals()[name](res, out)
        except KeyError as missing:
            plt.close("all")
            log(f"plots: no {name} figure: this run has no {missing} measurements")
    return paths


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("compare_json", help="a compare.json that bench/compare wrote")
    p.add_argument("--out", help="directory for the figures (default: beside compare_json)")
    args = p.parse_args()
    with open(args.compare_json) as f:
        res = json.load(f)["results"]
    out = args.out or os.path.dirname(os.path.abspath(args.compare_json))
    for path in write_all(res, out):
        print(path)


if __name__ == "__main__":
    sys.exit(main())

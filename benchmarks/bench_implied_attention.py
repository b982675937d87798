"""Mamba-1 implied attention: ours against TransformerLens 4.3's ``compute_ssm_effective_attention``, in one run.

A one-layer random-weight HF ``MambaForCausalLM`` (d_model 256, d_inner 512, d_state 16) is loaded into our
hooked model (``gather_aggregate.adapters.load_ssm``) and into TL's bridge (``eager_scan=True``, run with
``use_cache=False``, as TL 4.3 needs for its SSM hooks to fire).  Both compute the per-channel matrix
``[1, 512, L, L]`` (``include_dt_scaling=True``, our default) from their own activation cache; the timed call is
the implied-attention computation only (the forward that filled the cache is not timed).

Every measurement runs in a fresh single-threaded child process whose address space is capped (``--max-gib``,
default 10), so a request that does not fit fails cleanly with ``MemoryError`` and is reported as failed.  Peak
memory is the growth of the child's resident set during the call (``VmHWM`` reset just before it).

Rows of the table:

* ``full``: per-channel matrices, ours vs TL (TL at ``--tl-lengths`` only), max |ours - TL|;
* ``full`` at longer ``--lengths``: ours only, checked against the float64 formula on 8 channels;
* ``mean of 512 ch`` / ``64-ch groups``: ``head_size`` = 512 / 64 with ``reduce="mean"`` at ``--group-length``,
  checked on the last row against the float64 formula;
* ``last row``: a Falcon-Mamba-7B-sized layer (d_model 4096, d_inner 8192, d_state 16, random weights),
  ``rows=-1`` at ``--falcon-length``, checked against the float64 formula on 256 channels.

Run: ``python benchmarks/bench_implied_attention.py`` (about 3-5 minutes on 2 busy cores), or e.g.
``--tl-lengths 64 128 --lengths 512 --group-sizes 512 --no-falcon`` for less.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import measure, run_child, single_thread  # noqa: E402

if TYPE_CHECKING:  # pragma: no cover
    from gather_aggregate.core.protocol import HookedModel

HERE = Path(__file__).resolve()
SSM_HOOKS = ("dt", "B", "C")


# ------------------------------------------------------------------ building blocks (also used by the smoke test)
def build_hf(model_type: str = "mamba", d_model: int = 256, d_state: int = 16, seed: int = 0, **over: Any) -> Any:
    """A one-layer random-weight HF Mamba-1 model (``expand=2``: d_inner = 2 * d_model)."""
    from gather_aggregate.testing.tiny_ssm import tiny_hf_ssm

    return tiny_hf_ssm(model_type, seed=seed, vocab_size=256, hidden_size=d_model, num_hidden_layers=1, expand=2,
                       state_size=d_state, **over)


def tokens_for(L: int, seed: int = 0) -> Any:
    import torch

    return torch.randint(0, 256, (1, L), generator=torch.Generator().manual_seed(seed))


def our_cache(model: HookedModel, tokens: Any) -> Any:
    names = [f"blocks.0.ssm.hook_{n}" for n in SSM_HOOKS]
    _, cache = model.run_with_cache(tokens, names_filter=names, stop_at_layer=1)
    return cache


def tl_bridge(hf: Any) -> Any:
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    bridge = build_bridge_from_module(hf, type(hf).__name__, hf_config=hf.config)
    for blk in bridge.blocks:
        blk.mixer.eager_scan = True  # TL 4.3: without it (and use_cache=False) the SSM hooks never fire
    return bridge


def reference_rows(cache: Any, A: Any, rows: list[int], channels: Any) -> Any:
    """float64 α_d[t, s] = Σ_n C_t B_s exp(A (τ_t - τ_s)) Δ_s for the given query rows and channels: [c, R, L]."""
    import torch

    dt, B, C = (cache[f"blocks.0.ssm.hook_{n}"][0].double() for n in SSM_HOOKS)
    dt, A = dt[:, channels], A.double()[channels]
    tau = dt.cumsum(0)  # [L, c]
    out = []
    for t in rows:
        gap = (tau[t] - tau[: t + 1]).T  # [c, s]
        decay = torch.exp(A[:, :, None] * gap[:, None, :])  # [c, N, s]
        a = torch.einsum("n,sn,cns->cs", C[t], B[: t + 1], decay) * dt[: t + 1].T
        out.append(torch.nn.functional.pad(a, (0, dt.shape[0] - t - 1)))
    return torch.stack(out, 1)


def diff_stats(got: Any, want: Any) -> dict[str, float]:
    d = float((got.double() - want.double()).abs().max())
    scale = float(want.abs().max())
    return {"max_abs_diff": d, "max_abs": scale, "rel_diff": d / scale if scale else float("nan")}


# ------------------------------------------------------------------ measurements (each in its own child process)
def bench_tl(L: int, d_model: int = 256, d_state: int = 16, seed: int = 0) -> dict[str, Any]:
    """TL's per-channel matrix, timed; then ours from our own cache, compared with it."""
    import torch

    from gather_aggregate.adapters import load_ssm

    hf = build_hf("mamba", d_model, d_state, seed)
    ours = load_ssm(hf)  # copies the weights; the bridge below wraps the HF modules themselves
    bridge = tl_bridge(hf)
    toks = tokens_for(L, seed)
    with torch.no_grad():
        _, tl_cache = bridge.run_with_cache(toks, use_cache=False)
        stats, theirs = measure(lambda: tl_cache.compute_ssm_effective_attention(layer=0, include_dt_scaling=True))
        tl_cache = None
        mine = ours.pattern(our_cache(ours, toks), 0)
    return {**stats, **diff_stats(mine, theirs), "shape": list(theirs.shape)}


def bench_ours(L: int, head_size: int = 1, rows: int | None = None, model_type: str = "mamba", d_model: int = 256,
               d_state: int = 16, seed: int = 0, repeats: int = 3, check_channels: int = 8) -> dict[str, Any]:
    """Our ``model.pattern`` from the cache (full, grouped with ``reduce="mean"``, or one query row), timed, and
    checked against the float64 formula (on ``check_channels`` channels; for groups, on the last row)."""
    import torch

    from gather_aggregate.adapters import load_ssm

    model = load_ssm(build_hf(model_type, d_model, d_state, seed), head_size=head_size)
    with torch.no_grad():
        cache = our_cache(model, tokens_for(L, seed))
        stats, alpha = measure(lambda: model.pattern(cache, 0, rows=rows), repeats)
        A = model.ssm_layer_params(0).A
        D = A.shape[0]
        if head_size > 1:  # a head is the mean of its channels: check the last row of head 0
            got = alpha[0, 0, -1]
            want = reference_rows(cache, A, [L - 1], torch.arange(head_size))[:, 0].mean(0)
        else:
            ch = torch.linspace(0, D - 1, min(check_channels, D)).round().long()
            q = [L - 1] if rows is not None else list(range(L))
            got = alpha[0, ch][:, -1:] if rows is not None else alpha[0, ch]
            want = reference_rows(cache, A, q, ch)
    return {**stats, **diff_stats(got, want), "shape": list(alpha.shape), "d_inner": D}


def bench_long_row(L: int, path: str = "chunked", d_model: int = 4096, d_state: int = 16, seed: int = 0,
                   check_channels: int = 64) -> dict[str, Any]:
    """The last query row on a Falcon-Mamba-7B-sized layer at a length whose forward would take minutes here:
    ``A`` and the ``dt_proj`` bias are the random-weight layer's own (HF's initialisation: Δ log-uniform in
    [1e-3, 1e-1]); ``Δ = softplus(bias + N(0, 0.5²))`` per position, ``B, C ~ N(0, 1)`` (FalconMamba
    RMS-normalises them).  ``path="tiled"`` forces the short-prompt path (the previous implementation)."""
    import torch

    import gather_aggregate.adapters.implied_mamba1 as m1
    from gather_aggregate.adapters.implied import mamba1_implied_attention

    hf = build_hf("falcon_mamba", d_model, d_state, seed)
    mixer = hf.backbone.layers[0].mixer
    A = -torch.exp(mixer.A_log.detach().float())
    g = torch.Generator().manual_seed(seed)
    dt = torch.nn.functional.softplus(mixer.dt_proj.bias.detach() + 0.5 * torch.randn(1, L, A.shape[0], generator=g))
    B, C = torch.randn(1, L, d_state, generator=g), torch.randn(1, L, d_state, generator=g)
    del hf, mixer
    if path == "tiled":
        m1.ROWS_LONG = L + 1
    rows = torch.tensor([[L - 1]])
    with torch.no_grad():
        stats, alpha = measure(lambda: mamba1_implied_attention(dt, A, B, C, rows=rows), 1)
        ch = torch.linspace(0, A.shape[0] - 1, check_channels).round().long()
        cache = {f"blocks.0.ssm.hook_{n}": v for n, v in (("dt", dt[:, :, ch]), ("B", B), ("C", C))}
        want = reference_rows(cache, A[ch], [L - 1], torch.arange(len(ch)))
    return {**stats, **diff_stats(alpha[0, ch, -1:], want), "shape": list(alpha.shape), "d_inner": A.shape[0]}


def bench_floor(L: int, d_inner: int = 512, d_state: int = 16, repeats: int = 5) -> dict[str, Any]:
    """What any implementation of the full per-channel matrix pays on this machine with torch's CPU kernels,
    measured: the first touch of the fresh ``[1, d_inner, L, L]`` fp32 output (allocate and write it once, page
    faults included) and the contraction over ``n`` (``torch.bmm [d, L, N] @ [d, N, L]`` into a touched buffer;
    the causal half needs half of it).  No exp, no decay, no zeros above the diagonal: a lower bound on the
    time, not a method."""
    import time

    import torch

    def best(fn: Any) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    def touch() -> None:
        out = torch.empty(1, d_inner, L, L)
        out.fill_(0.0)
        del out

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(d_inner, L, d_state, generator=g), torch.randn(d_inner, d_state, L, generator=g)
    buf = torch.zeros(d_inner, L, L)
    t_touch = best(touch)
    t_rewrite = best(lambda: buf.fill_(1.0))
    t_bmm = best(lambda: torch.bmm(q, k, out=buf))
    return {"L": L, "d_inner": d_inner, "d_state": d_state, "touch_s": t_touch, "rewrite_s": t_rewrite,
            "bmm_square_s": t_bmm, "floor_s": t_touch + t_bmm / 2,
            "gflops": 2 * d_inner * L * L * d_state / t_bmm / 1e9}


def child(spec: dict[str, Any]) -> None:
    single_thread()
    threads = spec.pop("threads", 1)
    if threads != 1:  # only the long-row rows take --long-row-threads; every other row runs on one thread
        import torch

        torch.set_num_threads(threads)
    fn = {"tl": bench_tl, "ours": bench_ours, "long_row": bench_long_row, "floor": bench_floor}[spec.pop("kind")]
    print(json.dumps(fn(**spec)))


# ------------------------------------------------------------------ the table
def fmt_time(r: dict[str, Any]) -> str:
    if "wall_s" not in r:
        return "-"
    return f"{r['wall_s']:.3f} s (CPU {r['cpu_s']:.3f} s)" if "cpu_s" in r else f"{r['wall_s']:.3f} s"


def fmt_mem(r: dict[str, Any]) -> str:
    if "dpeak_mib" not in r:
        return "-"
    m = r["dpeak_mib"]
    return f"{m / 1024:.2f} GiB" if m >= 1024 else f"{m:.0f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--tl-lengths", type=int, nargs="*", default=[64, 128, 256])
    ap.add_argument("--lengths", type=int, nargs="*", default=[512], help="ours-only full-matrix lengths")
    ap.add_argument("--group-length", type=int, default=4096)
    ap.add_argument("--group-sizes", type=int, nargs="*", default=[512, 64])
    ap.add_argument("--falcon-length", type=int, default=2048)
    ap.add_argument("--no-falcon", action="store_true")
    ap.add_argument("--long-row-lengths", type=int, nargs="*", default=[16384],
                    help="last row on a 7B-sized layer with synthetic Δ/B/C (no forward): new path and the tiled one")
    ap.add_argument("--long-row-threads", type=int, nargs="*", default=[1],
                    help="torch threads of the long-row rows (one row per count and path)")
    ap.add_argument("--floor", action="store_true",
                    help="also measure the full matrix's floor at each --tl-lengths L (first touch of the output + "
                         "half a square bmm over n) and the largest TL/ours ratio it allows")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of our (cheap) calls; TL runs once")
    ap.add_argument("--max-gib", type=float, default=10.0, help="address-space cap of every child process")
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child))
        return

    def run(spec: dict[str, Any]) -> dict[str, Any]:
        print(f"  running {spec} ...", file=sys.stderr, flush=True)
        r = run_child(HERE, dict(spec), max_gib=args.max_gib)
        print(f"    -> {r}", file=sys.stderr, flush=True)
        return r

    rows: list[tuple[str, int, dict[str, Any], dict[str, Any]]] = []
    floors: dict[int, dict[str, Any]] = {}
    for L in args.tl_lengths:
        rows.append(("full, per channel", L, run({"kind": "tl", "L": L}),
                     run({"kind": "ours", "L": L, "repeats": args.repeats})))
        if args.floor:
            floors[L] = run({"kind": "floor", "L": L})
    for L in args.lengths:
        rows.append(("full, per channel", L, {}, run({"kind": "ours", "L": L, "repeats": args.repeats})))
    for hs in args.group_sizes:
        label = "mean of all 512 ch" if hs == 512 else f"{hs}-ch groups, mean"
        rows.append((label, args.group_length, {},
                     run({"kind": "ours", "L": args.group_length, "head_size": hs, "repeats": 1})))
    if not args.no_falcon:
        rows.append(("last row, 7B-sized layer", args.falcon_length, {},
                     run({"kind": "ours", "L": args.falcon_length, "rows": -1, "model_type": "falcon_mamba",
                          "d_model": 4096, "repeats": args.repeats, "check_channels": 256})))
    for L in args.long_row_lengths:
        for threads in args.long_row_threads:
            for path in ("chunked", "tiled"):
                on = "" if threads == 1 else f", {threads} threads"
                rows.append((f"last row, 7B-sized layer, synthetic Δ ({path} path{on})", L, {},
                             run({"kind": "long_row", "L": L, "path": path, "threads": threads})))

    from _common import machine

    single_thread()
    print(f"\nMamba-1 implied attention, batch 1, random weights; {machine()} (at the end of the run)")
    print(f"TL = TransformerLens compute_ssm_effective_attention (eager_scan), 1 run; ours = min of {args.repeats} "
          f"runs (1 for the grouped rows), and the first call in the process; times are wall-clock; "
          f"memory = peak RSS growth during the call(s); every run in its own process capped at {args.max_gib:g} GiB.\n")
    print("| request | d_inner | L | output | TL time | TL peak | ours time | ours 1st call | ours peak "
          "| TL/ours time | TL/ours peak | max abs diff vs TL (rel) | rel diff vs float64 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, L, tl, ours in rows:
        tl_t = (tl.get("error") or fmt_time(tl)) if tl else "-"
        if "error" in ours:
            print(f"| {label} | | {L} | | {tl_t} | | {ours['error']} | | | | | | |")
            continue
        shape = "x".join(str(s) for s in ours["shape"][1:])
        speed = mem = diff = "-"
        if tl and "error" not in tl:
            speed = f"{tl['wall_s'] / ours['wall_s']:.0f}x (CPU {tl['cpu_s'] / ours['cpu_s']:.0f}x)"
            mem = f"{tl['dpeak_mib'] / max(ours['dpeak_mib'], 1e-9):.0f}x"
            diff = f"{tl['max_abs_diff']:.1e} ({tl['rel_diff']:.0e})"
        print(f"| {label} | {ours['d_inner']} | {L} | {shape} | {tl_t} | {fmt_mem(tl) if tl else '-'} | "
              f"{fmt_time(ours)} | {ours['first_wall_s']:.3f} s | {fmt_mem(ours)} | {speed} | {mem} | {diff} | "
              f"{ours['rel_diff']:.0e} |")
    if floors:
        print_floors(rows, floors)
    print("\n(rel = max abs diff / max |reference|.  The float64 check: per channel on 8 (7B layer: 256) channels, "
          "all rows (7B: the last row); grouped: the last row of head 0.)")
    print("\nraw: " + json.dumps([{"request": r[0], "L": r[1], "tl": r[2], "ours": r[3]} for r in rows]))


def print_floors(rows: list[tuple[str, int, dict[str, Any], dict[str, Any]]], floors: dict[int, dict[str, Any]]) -> None:
    """The floor table: what the output's first touch and the contraction cost, and the ratio they allow."""
    print("\nFloor of the full per-channel matrix on this machine (same run, one thread, best of 5): first touch "
          "of the fresh output, plus half of a square bmm over n into a touched buffer.  A lower bound on any "
          "implementation built on torch's CPU kernels, not a method.\n")
    print("| L | d_inner | first touch of the output | rewrite of a touched buffer | bmm [d,L,N]@[d,N,L] | floor "
          "| TL time | largest TL/ours the floor allows | ours | TL/ours |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, L, tl, ours in rows:
        f = floors.get(L)
        if label != "full, per channel" or not f or "error" in f or not tl or "error" in tl or "error" in ours:
            continue
        print(f"| {L} | {f['d_inner']} | {f['touch_s']:.4f} s | {f['rewrite_s']:.4f} s | {f['bmm_square_s']:.4f} s "
              f"({f['gflops']:.0f} GFLOP/s) | {f['floor_s']:.4f} s | {tl['wall_s']:.2f} s | "
              f"{tl['wall_s'] / f['floor_s']:.0f}x | {ours['wall_s']:.3f} s | {tl['wall_s'] / ours['wall_s']:.0f}x |")


if __name__ == "__main__":
    main()

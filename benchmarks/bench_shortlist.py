"""How long a shortlist must be for the exact scan to see the heads that matter: estimators as shortlist makers.

The workflow for a model too large for an exact scan of every head: rank all heads with a cheap estimator, then
scan the top ``m`` exactly (``attribution_scan(..., verify=m)``, or ``exact_scan(..., heads=approx.top(m))``).
It is only as good as the shortlist: a head the estimator puts below ``m`` is never scanned.

For each model (the zoo and, with ``--fixtures``, the detector's fresh models on their own tasks, as
``bench_attribution.py`` builds them; same 32 prompts and metric as there) and estimator, this prints the shortest
shortlist that holds

* **top-1 / top-3 / top-5:** the exact scan's 1, 3, 5 largest drops;
* **≥ 10 %:** every head whose exact drop is at least 10 % of the largest;
* **> 2 SE:** every head whose exact drop exceeds two standard errors over the prompts
  (``ScanResult.significant()``): the heads the exact scan tells apart from prompt-to-prompt noise,

as ``m`` (heads), when the shortlist takes the ``m`` largest estimates by magnitude ``|ĉ|`` (what ``verify=m``
and ``ScanResult.top(m, by="magnitude")`` take) and, in the second table, by signed score (``ScanResult.top(m)``:
the largest estimated drops).

    python benchmarks/bench_shortlist.py --fixtures
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))

#: what the shortlist must hold: label -> heads of the exact scan
TARGETS = ("top-1", "top-3", "top-5", "≥ 10 %", "> 2 SE")


def needed(exact: dict, est: dict, by: str, significant: list) -> dict[str, int]:
    """Shortest ``m`` such that the estimator's top ``m`` (``by="magnitude"`` of the estimate, or ``"signed"``) holds
    each target set of the exact scan (``exact``/``est``: head -> score; ties broken by head index;
    ``significant``: the exact scan's heads above two standard errors)."""
    key = (lambda hd: (-abs(est[hd]), hd)) if by == "magnitude" else (lambda hd: (-est[hd], hd))
    position = {hd: i + 1 for i, hd in enumerate(sorted(est, key=key))}
    by_exact = sorted(exact, key=lambda hd: (-exact[hd], hd))
    best = exact[by_exact[0]]
    sets = {"top-1": by_exact[:1], "top-3": by_exact[:3], "top-5": by_exact[:5],
            "≥ 10 %": [hd for hd in by_exact if best > 0 and exact[hd] >= 0.1 * best], "> 2 SE": significant}
    return {label: max(position[hd] for hd in heads) if heads else 0 for label, heads in sets.items()}


def bench(name: str, path, n: int, steps: int, fixture: bool) -> dict:
    from bench_attribution import fixture_setup
    from bench_scan import kv_setup

    from gather_aggregate.attribution.estimators import attribution_scan
    from gather_aggregate.scan.exact import exact_scan

    model, _, tokens, metric = fixture_setup(path, n, "logprob") if fixture else kv_setup(name, n, None, 1, path,
                                                                                         "logprob")
    scan = exact_scan(model, tokens, metric, progress=False)
    exact, significant = scan.scores(), scan.significant(z=2.0)
    methods = {"AtP": dict(estimator="atp"), "AtP*": dict(estimator="atp*"),
               f"IG k={steps}": dict(estimator="ig", steps=steps), "AtP-softmax": dict(estimator="atp-softmax"),
               "AtP*-softmax": dict(estimator="atp*-softmax")}
    row = {"model": name, "heads": len(exact), "significant": len(significant), "methods": {}}
    top = max(exact, key=lambda hd: (exact[hd], hd))
    for label, kw in methods.items():
        est = attribution_scan(model, tokens, metric, **kw).scores()
        row["methods"][label] = {by: needed(exact, est, by, significant) for by in ("magnitude", "signed")}
        if label == "AtP":  # how the exact top head stands out by |AtP|
            row["atp_top"] = (top, exact[top], est[top], max(abs(v) for hd, v in est.items() if hd != top))
    return row


def main(argv: list[str] | None = None) -> int:
    import torch

    from gather_aggregate.zoo import list_zoo

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=None, help="zoo names (default: all)")
    p.add_argument("--n", type=int, default=32, help="prompts")
    p.add_argument("--steps", type=int, default=4, help="integrated-gradients path points")
    p.add_argument("--fixtures", action="store_true", help="also the detector's fresh models (tests/fixtures/models)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    from bench_attribution import fixture_dirs

    targets = [(m, None, False) for m in (args.models if args.models is not None else list(list_zoo()))]
    if args.fixtures:
        targets += [(d.name, d, True) for d in fixture_dirs()]
    rows = []
    for name, path, fixture in targets:
        rows.append(bench(name, path, args.n, args.steps, fixture))
        print(f"  {name}: {rows[-1]['methods']}", file=sys.stderr, flush=True)
    for by in ("magnitude", "signed"):
        labels = list(rows[0]["methods"])
        print(f"\nShortlist by {'|estimate|' if by == 'magnitude' else 'signed estimate'}: heads needed to hold the "
              f"exact scan's {' / '.join(TARGETS)}\n")
        print("| model | heads | > 2 SE | " + " | ".join(labels) + " |")
        print("|---|---|---|" + "---|" * len(labels))
        for r in rows:
            cells = [" / ".join(str(v) for v in r["methods"][lab][by].values()) for lab in labels]
            print(f"| {r['model']} | {r['heads']} | {r['significant']} | " + " | ".join(cells) + " |")
        worst = {lab: max(r["methods"][lab][by]["top-5"] / r["heads"] for r in rows) for lab in labels}
        print("\nlongest shortlist for the top-5, as a share of the model's heads: "
              + "; ".join(f"{lab} {w:.0%}" for lab, w in worst.items()))
    print("\nThe exact scan's top head under AtP: its exact drop, its AtP estimate, and the largest |AtP| of the "
          "other heads\n")
    print("| model | top head | exact | AtP | largest other abs(AtP) |")
    print("|---|---|---|---|---|")
    for r in rows:
        (la, h), ex, atp, other = r["atp_top"]
        print(f"| {r['model']} | L{la}H{h} | {ex:.2f} | {atp:.4f} | {other:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

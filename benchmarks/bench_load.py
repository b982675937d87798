"""Load real-width random checkpoints: peak RSS / parameter bytes, load time against HF, max |Δlogit|.

For each family a random checkpoint with the published widths (``gather_aggregate.testing.realwidth``),
``--layers`` layers, the shipped dtype and sharding is written once, then every measurement runs in a fresh
single-threaded child process:

* ``ours``: ``load_model(dir)`` (``dtype="auto"``: the shipped dtype), ``hf``: ``AutoModelForCausalLM
  .from_pretrained(dir)`` (its default ``dtype="auto"`` too).  Peak = growth of the child's ``VmHWM`` over the
  load, after ``malloc_trim`` and a ``clear_refs`` reset; ratio = peak / bytes of the loaded parameters.
* exactness: both load again in fp32 in their own children and write the logits of one random 64-token
  prompt; the parent compares them.

Llama goes through ``TransformerBridge`` (HF loads it, so "ours" is HF's load plus the bridge).
``mamba2-2.7b`` is written in mamba-ssm's own format (fp32 ``pytorch_model.bin``); HF's side loads an
HF-format copy of the same weights. ``llamba-8b`` is in Cartesia's format: HF has no Llamba class (and
Cartesia's code needs CUDA), so it has no HF load and its logits are compared with the sequential oracle of
Cartesia's forward (``llamba_testing.llamba_reference_logits``), run in its own child.
``peak incl. forward`` is the peak growth through the load and one 4-token forward (HF reads its
memory-mapped weights there).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_load.py            # all families, ~10 min here
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_load.py --families falcon-mamba-7b --layers 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FAMILIES = ("falcon-mamba-7b", "mamba2-2.7b", "zamba2-7b", "jamba-v0.1", "bamba-9b", "llama-3.1-8b", "llamba-8b",
            "nemotron-h-8b", "granite-4.0-h-tiny", "qwen3-next-80b-a3b", "falcon-h1-7b", "deepseek-v2-lite")
#: cuts that keep every fp32 child under ~4 GiB on this 24 GiB machine shared by several workers (Nemotron-H's
#: blocks hold one mixer each: 3 blocks, one Mamba-2, one attention, one MLP)
CUTS: dict[str, dict] = {
    "llama-3.1-8b": {"vocab": 32000}, "bamba-9b": {"vocab": 32000}, "jamba-v0.1": {"vocab": 16384, "n_experts": 3},
    "llamba-8b": {"vocab": 32000}, "nemotron-h-8b": {"vocab": 32000, "n_layers": 3},
    "granite-4.0-h-tiny": {"n_experts": None}, "qwen3-next-80b-a3b": {"vocab": 32000, "n_experts": 64},
    "falcon-h1-7b": {"vocab": 32000}, "deepseek-v2-lite": {"vocab": 32000, "n_experts": 64}}


def _label(name: str) -> str:
    cut = CUTS.get(name, {})
    parts = [f"{v} layers" if k == "n_layers" else f"vocab {v}" if k == "vocab" else
             "all experts" if v is None else f"{v} experts" for k, v in cut.items()]
    return ", ".join([name, *parts])


def _rss_reset() -> None:
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # pragma: no cover
        pass
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def _status(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    return 0


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    import transformers  # noqa: F401 - imported before the baseline is taken
    from transformers import AutoModelForCausalLM

    import gather_aggregate.adapters  # noqa: F401 - imported before the baseline is taken
    if args.child == "ours":  # our loaders and TransformerLens (imported on first use): a once-per-session cost,
        import transformer_lens.model_bridge  # noqa: F401

        import gather_aggregate.adapters.convert  # noqa: F401 - kept out of the timed load and its peak
        import gather_aggregate.adapters.hybrid_convert  # noqa: F401
        import gather_aggregate.adapters.llamba  # noqa: F401
        import gather_aggregate.models.bridge  # noqa: F401
    from gather_aggregate import load_model
    from gather_aggregate.testing.realwidth import param_bytes

    d = Path(args.dir)
    dtype = "float32" if args.logits else None
    if args.child == "oracle":  # Llamba: the sequential oracle of Cartesia's forward (no HF class)
        from gather_aggregate.testing.realwidth import reference_logits

        raw = json.loads((d / "config.json").read_text())
        tokens = torch.randint(0, min(raw["vocab_size"], 32000), (1, 64), generator=torch.Generator().manual_seed(0))
        torch.save(reference_logits("llamba-8b", d, tokens), args.logits)
        print(json.dumps({}))
        return
    _rss_reset()
    base = _status("VmRSS")
    t0 = time.perf_counter()
    if args.child == "ours":
        model = load_model(d, tokenizer=False, dtype=dtype)
        module = getattr(model, "module", model)
    else:
        model = module = AutoModelForCausalLM.from_pretrained(d, dtype=dtype or "auto")
    secs = time.perf_counter() - t0
    out = {"peak": _status("VmHWM") - base, "secs": secs, "param_bytes": param_bytes(module),
           "dtype": str(next(module.parameters()).dtype)}
    with torch.no_grad():  # one short forward touches every weight (HF's are memory-mapped until read)
        model(torch.zeros(1, 4, dtype=torch.long))
    out["after_forward"] = _status("VmRSS") - base
    out["peak_forward"] = _status("VmHWM") - base
    if args.logits:
        vocab = module.config.vocab_size if hasattr(module, "config") else model.cfg.d_vocab
        if (d / "config.json").is_file():  # the real vocabulary (Llamba's embedding is padded)
            vocab = json.loads((d / "config.json").read_text()).get("vocab_size", vocab)
        tokens = torch.randint(0, min(vocab, 32000), (1, 64), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            logits = model(tokens) if args.child == "ours" else model(tokens).logits
        torch.save(logits.float(), args.logits)
    print(json.dumps(out))


def _run(mode: str, d: Path, logits: Path | None = None) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--dir", str(d)] + (["--logits", str(logits)] if logits else [])
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode:
        raise RuntimeError(f"{mode} on {d} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _hf_copy(src: Path, dst: Path, name: str, layers: int) -> Path:
    """An HF-format copy of a mamba-ssm checkpoint (for HF's side of the comparison)."""
    import torch
    from transformers import AutoModelForCausalLM

    from gather_aggregate.testing.realwidth import hf_config

    cfg = hf_config(name, **{"n_layers": layers, **CUTS.get(name, {})})
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(cfg)
    sd = torch.load(src / "pytorch_model.bin", weights_only=True, mmap=True)
    sd = {k.replace("backbone.embedding.", "backbone.embeddings."): v for k, v in sd.items()}
    hf.load_state_dict(sd, assign=True, strict=False)
    hf.tie_weights()
    hf.config.dtype = torch.float32
    hf.save_pretrained(dst)
    return dst


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", nargs="*", default=list(FAMILIES))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--workdir", default=None, help="where the checkpoints go (default: a temp dir, removed)")
    p.add_argument("--child", default=None)
    p.add_argument("--dir", default=None)
    p.add_argument("--logits", default=None)
    args = p.parse_args()
    if args.child:
        return child(args)
    from gather_aggregate.testing.realwidth import write_checkpoint

    rows = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for name in args.families:
            import torch

            kw = {"n_layers": args.layers, **CUTS.get(name, {})}
            d = write_checkpoint(name, Path(tmp) / name, **kw)
            hf_dir = _hf_copy(d, Path(tmp) / (name + "-hf"), name, args.layers) if name == "mamba2-2.7b" else d
            oracle = name == "llamba-8b"
            load = os.getloadavg()[0]
            ours = _run("ours", d)
            hf = None if oracle else _run("hf", hf_dir)
            _run("ours", d, Path(tmp) / "ours.pt")
            _run("oracle" if oracle else "hf", hf_dir, Path(tmp) / "hf.pt")
            ref = torch.load(Path(tmp) / "hf.pt")
            diff = (torch.load(Path(tmp) / "ours.pt") - ref).abs().max().item()
            ours["max_logit"] = ref.abs().max().item()
            ours["load"] = (load + os.getloadavg()[0]) / 2
            files = sorted(f.name for f in d.iterdir() if f.suffix in (".safetensors", ".bin"))
            rows.append((_label(name), ours, hf, diff, files))
            print(f"{name}: ours {ours} hf {hf} max|dlogit| {diff:.1e}", flush=True)
            for f in Path(tmp).glob(name + "*"):
                subprocess.run(["rm", "-rf", str(f)], check=True)
    print("\n| model (published widths, 2 layers unless noted) | files | dtype kept | params | ours peak / params | "
          "HF peak / params | ours / HF peak incl. forward | ours load | HF load | ours/HF time | "
          "max \\|Δlogit\\| fp32 (max \\|logit\\|) | load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, ours, hf, diff, files in rows:
        pb = ours["param_bytes"]
        hf_cols = ("– (no HF class)", f"{ours['peak_forward'] / pb:.2f} / –", f"{ours['secs']:.2f} s", "–", "–") \
            if hf is None else (f"{hf['peak'] / hf['param_bytes']:.2f}",
                                f"{ours['peak_forward'] / pb:.2f} / {hf['peak_forward'] / hf['param_bytes']:.2f}",
                                f"{ours['secs']:.2f} s", f"{hf['secs']:.2f} s", f"{ours['secs'] / hf['secs']:.2f}")
        print(f"| {name} | {len(files)} × {files[0].split('.')[-1]} | {ours['dtype'].replace('torch.', '')} | "
              f"{pb / 2**30:.2f} GiB | **{ours['peak'] / pb:.2f}** | " + " | ".join(hf_cols) +
              f" | {diff:.1e} ({ours['max_logit']:.2g}){' vs oracle' if hf is None else ''} | {ours['load']:.1f} |")


if __name__ == "__main__":
    main()

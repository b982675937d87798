"""Checks every hybrid family's test file runs the same way (Granite-4, Nemotron-H, Qwen3-Next, ...).

Each check keeps the assertions and tolerances the family tests had when they were three copies; a family test
calls them with what is its own (the HF model builder, the sequence lengths, the layer count, the config edit).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pytest
import torch

from gather_aggregate.core.errors import CheckpointError
from gather_aggregate.core.protocol import count_hooks, param_checksum

if TYPE_CHECKING:  # pragma: no cover
    from gather_aggregate.adapters.hybrid import HookedHybrid


def tokens(vocab: int, n: int = 2, L: int = 21, seed: int = 0) -> torch.Tensor:
    """``n`` random token rows of length ``L`` drawn from ``[0, vocab)`` with a fixed seed."""
    return torch.randint(0, vocab, (n, L), generator=torch.Generator().manual_seed(seed))


def check_matches_hf(hf: Any, load: Callable[[Any], Any], toks: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """The converted model's logits equal HF's to 1e-4 on ``toks``, and HF's weights are left untouched.

    Returns ``(model, ref)``: the converted model and HF's logits, to check further settings against.
    """
    before = param_checksum(hf)
    model = load(hf)
    with torch.no_grad():
        ref = hf(toks, use_cache=False).logits
    assert ref.abs().max() > 0.5  # the weights are not degenerate
    torch.testing.assert_close(model(toks), ref, atol=1e-4, rtol=1e-4)
    assert param_checksum(hf) == before
    return model, ref


def check_mamba2_heads_rebuilt(model: HookedHybrid, toks: torch.Tensor) -> None:
    """Implied attention rebuilds every Mamba-2 head of every layer that has some (a whole SSM layer, or the
    Mamba-2 heads beside attention in one layer): ``y = α x + D x`` to a relative 1e-5."""
    _, cache = model.run_with_cache(toks)
    for info in model.layers:
        if not (ssm_heads := info.heads_of("ssm")):
            continue
        L, H, P = info.index, model.cfg.n_heads, model.cfg.d_head
        alpha = model.pattern(cache, L, heads=ssm_heads)
        x = cache[f"blocks.{L}.ssm.hook_x"].unflatten(-1, (H, P))
        y = cache[f"blocks.{L}.ssm.hook_y"].unflatten(-1, (H, P))
        rebuilt = torch.einsum("bhts,bshp->bthp", alpha, x) + model.ssm_layer_params(L).D[:, None] * x
        assert float((rebuilt - y).norm() / y.norm()) <= 1e-5


def save_and_load(make_hf: Callable[..., Any], seed: int, tmp_dir: Path, **overrides: Any
                  ) -> tuple[Any, Any, Any, Any, Path]:
    """A tiny HF model (``make_hf(seed, **overrides)``) on the toy world's tokenizer, saved to ``tmp_dir`` and
    loaded back.

    Returns ``(world, tokenizer, hf, model, directory)``.
    """
    from gather_aggregate import load_model
    from gather_aggregate.testing.tiny_models import save_model_dir
    from gather_aggregate.training.vocab import build_tokenizer, make_world

    world = make_world(seed=0)
    tok = build_tokenizer(world)
    hf = make_hf(seed, vocab_size=len(tok), **overrides)
    d = save_model_dir(hf, tok, tmp_dir)
    return world, tok, hf, load_model(d), d


def check_protocol_on_disk(hf: Any, model: HookedHybrid, attn_layer: int = 1) -> tuple[torch.Tensor, Any]:
    """Logits equal HF's and the attention heads' pattern rows of ``attn_layer`` sum to one."""
    toks = tokens(model.d_vocab, L=30)
    logits, cache = model.run_with_cache(toks)
    with torch.no_grad():
        torch.testing.assert_close(logits, hf(toks, use_cache=False).logits, atol=1e-4, rtol=1e-4)
    heads = model.layers[attn_layer].heads_of("attn")
    torch.testing.assert_close(model.pattern(cache, attn_layer, heads=heads).sum(-1), torch.ones(2, len(heads), 30))
    return logits, cache


def check_scan_and_detector(saved: tuple, n_layers: int, n_scores: int, scan_heads: tuple[int, ...] = (0, 3)) -> Any:
    """The exact scan equals the naive one on heads ``scan_heads`` of every layer, each row of the scan and of the
    pattern scores carrying its head's kind; the detector runs on both kinds; the model comes back unchanged and
    hook-free. Returns the model."""
    from gather_aggregate.detect.detector import find_ga_heads, pattern_scores
    from gather_aggregate.scan.exact import exact_scan, naive_scan
    from gather_aggregate.tasks.kv import KVRetrieval

    world, tok, _, model, _ = saved
    before = param_checksum(model)
    toks = tokens(model.d_vocab, L=12, seed=1)
    target = torch.tensor([3, 7])

    def metric(logits):
        return logits[:, -1].log_softmax(-1).gather(1, target[:, None]).mean()

    heads = [(L, h) for L in range(n_layers) for h in scan_heads]
    exact = exact_scan(model, toks, metric, heads=heads, progress=False, max_rows=8)
    naive = naive_scan(model, toks, metric, heads=heads, progress=False)
    assert {r["kind"] for r in exact.rows} == {"attn", "ssm"}
    for layer, head in heads:
        assert exact.score(layer, head) == pytest.approx(naive.score(layer, head), abs=1e-5)
        kinds = [r["kind"] for r in exact.rows if (r["layer"], r["head"]) == (layer, head)]
        assert kinds == [model.head_kinds(layer)[head]], (layer, head, kinds)
    examples = KVRetrieval(n_pairs=4, keys=world.kv_keys, values=world.kv_values).examples(tok, n=4, seed=1)
    table = pattern_scores(model, examples)
    assert {r["kind"] for r in table} == {"attn", "ssm"} and len(table) == n_scores
    assert all(r["kind"] == model.head_kinds(r["layer"])[r["head"]] for r in table)
    assert find_ga_heads(model, examples, scores=table) is not None
    assert param_checksum(model) == before and count_hooks(model) == 0
    return model


def refused_config_message(saved_dir: Path, tmp_path: Path, edit: Callable[[dict], None]) -> str:
    """Copy the saved checkpoint, let ``edit`` change its config.json, and return the CheckpointError's message
    that ``load_model`` raises on it (the test fails when it loads)."""
    from gather_aggregate import load_model

    bad = tmp_path / "bad"
    shutil.copytree(saved_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    edit(cfg)
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError) as err:
        load_model(bad)
    return str(err.value)


class HybridFamilySuite:
    """The tests every hybrid family runs; a family's test file subclasses it as ``Test<Family>`` and fills in
    what is its own (pytest collects only the subclasses)."""

    #: ``make_hf(seed, config=None, **overrides)``: a random HF model of the family in eval mode
    make_hf: Callable[..., Any]
    #: ``random_config(seed)``: a randomised small HF config
    random_config: Callable[[int], Any]
    #: ``load(hf)``: the hooked model of an in-memory HF model
    load: Callable[[Any], Any]
    #: the hooked model class ``load_model`` gives for a saved checkpoint, and its layers' kinds
    hooked_class: type
    layer_kinds: tuple[str, ...] = ("ssm", "attn", "ssm")
    lengths: tuple[int, int, int] = (9, 33, 50)  # prompt lengths of the random-config tests, cycled by seed
    saved_seed = 4  # the seed of the model saved to disk
    saved_overrides: ClassVar[dict[str, Any]] = {}  # config overrides of the model saved to disk
    scan_heads: tuple[int, ...] = (0, 3)  # the heads of each layer the exact and naive scans compare
    n_layers = 3  # protocol layers of the saved model
    n_scores = 8 + 4 + 8  # rows of its pattern-score table

    def check_random_model(self, model: HookedHybrid, toks: torch.Tensor, ref: torch.Tensor) -> None:
        """More checks on each random-config model (its logits already equal HF's ``ref``)."""
        check_mamba2_heads_rebuilt(model, toks)

    def edit_config(self, cfg: dict) -> None:
        """Make the saved config.json disagree with its weights."""
        raise NotImplementedError

    def check_refusal(self, msg: str) -> None:
        """What the CheckpointError of the disagreeing config must name."""
        raise NotImplementedError

    def check_saved(self, model: HookedHybrid) -> None:
        """More checks on the model loaded from disk, after the scan and the detector ran on it."""

    def check_loaded(self, hf: Any, model: HookedHybrid, logits: torch.Tensor, cache: Any) -> None:
        """More checks on the model loaded from disk (its logits on 30 tokens equal HF's): by default, resuming
        the forward pass at layer 1 from the cached residual gives the same logits."""
        torch.testing.assert_close(model(cache["blocks.1.hook_resid_pre"], start_at_layer=1), logits)

    @pytest.mark.parametrize("seed", range(12))
    def test_random_configs_match_hf(self, seed):
        hf = type(self).make_hf(seed, config=type(self).random_config(seed))
        toks = tokens(61, L=self.lengths[seed % 3], seed=seed)
        model, ref = check_matches_hf(hf, type(self).load, toks)
        self.check_random_model(model, toks, ref)

    @pytest.fixture(scope="class")
    def saved(self, tmp_path_factory):
        return save_and_load(type(self).make_hf, self.saved_seed, tmp_path_factory.mktemp(type(self).__name__),
                             **self.saved_overrides)

    def test_load_model_from_disk_and_protocol(self, saved):
        _, _, hf, model, _ = saved
        assert isinstance(model, self.hooked_class)
        assert tuple(i.kind for i in model.layers) == self.layer_kinds
        logits, cache = check_protocol_on_disk(hf, model)
        self.check_loaded(hf, model, logits, cache)

    def test_exact_scan_and_detector_run(self, saved):
        self.check_saved(check_scan_and_detector(saved, n_layers=self.n_layers, n_scores=self.n_scores,
                                                 scan_heads=self.scan_heads))

    def test_a_checkpoint_whose_config_disagrees_is_refused(self, saved, tmp_path):
        self.check_refusal(refused_config_message(saved[4], tmp_path, self.edit_config))

"""Issue 7, part 1: offline circuitsvis attention views and the fitting of long prompts."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gather_aggregate.core.errors import IndexOutOfRangeError, InputError
from gather_aggregate.viz import attention_heads, attention_pattern, attention_row_view, fit_pattern
from gather_aggregate.viz.assets import circuitsvis_js, json_for_script, script_safe
from gather_aggregate.viz.synthetic import kv_prompt, mamba2_implied_pattern, softmax_pattern


@pytest.fixture(scope="module")
def prompt():
    return kv_prompt(n_keys=5, target_index=1)


@pytest.fixture(scope="module")
def attn(prompt):
    return softmax_pattern(prompt, n_heads=4)


@pytest.fixture(scope="module")
def ssm(prompt):
    return mamba2_implied_pattern(len(prompt.tokens), n_heads=3)


def _closing_script_tags(html: str) -> int:
    return len(re.findall(r"</script", html, flags=re.IGNORECASE))


# --------------------------------------------------------------------------- softmax vs signed
def test_softmax_heads_view(prompt, attn):
    view = attention_heads(attn[None], prompt.tokens, layer=4, heads=[0, 1, 2, 3], title="L4")
    assert view.component == "AttentionHeads" and not view.signed
    p = view.props
    assert len(p["attention"]) == 4 and len(p["attention"][0]) == len(prompt.tokens)
    torch.testing.assert_close(torch.tensor(p["attention"]), attn, atol=1e-5, rtol=0)
    assert p["attentionHeadNames"] == ["L4H0", "L4H1", "L4H2", "L4H3"]
    assert (p["minValue"], p["maxValue"]) == (0.0, 1.0)
    # the "\n" summary tokens stay visible in the axis labels (circuitsvis strips whitespace)
    assert p["tokens"][prompt.summaries[0]] == "\\n"
    assert view.note is None


def test_signed_ssm_view_uses_negative_colour_and_per_head_scale(prompt, ssm):
    assert (ssm < 0).any(), "the synthetic implied attention should have negative entries"
    view = attention_heads(ssm, prompt.tokens, layer=2)
    assert view.signed
    p = view.props
    assert p["minValue"] == -1.0 and p["maxValue"] == 1.0
    assert p["negativeColor"] != p["positiveColor"]
    shown = torch.tensor(p["attention"])
    # each head divided by its own max |alpha|: every head spans the full range, signs kept
    torch.testing.assert_close(shown.abs().amax(dim=(1, 2)), torch.ones(3), atol=1e-4, rtol=0)
    torch.testing.assert_close(shown, ssm / ssm.abs().amax(dim=(1, 2), keepdim=True), atol=1e-4, rtol=0)
    assert "signed" in view.note and "max |α|" in view.note
    for h in range(3):  # the note states the scale factors
        assert f"{ssm[h].abs().max().item():.3g}" in view.note


def test_signed_raw_and_global_scales(prompt, ssm):
    raw = attention_heads(ssm, prompt.tokens, scale=None)
    m = ssm.abs().max().item()
    assert raw.props["maxValue"] == pytest.approx(m) and raw.props["minValue"] == pytest.approx(-m)
    torch.testing.assert_close(torch.tensor(raw.props["attention"]), ssm, atol=1e-4, rtol=0)
    glob = attention_heads(ssm, prompt.tokens, scale="global")
    torch.testing.assert_close(torch.tensor(glob.props["attention"]), ssm / m, atol=1e-4, rtol=0)
    with pytest.raises(InputError, match="scale"):
        attention_heads(ssm, prompt.tokens, scale="row")


def test_kind_checks(prompt, attn, ssm):
    # a softmax pattern forced to 'implied' is drawn signed; a signed one cannot pass as softmax
    assert attention_heads(attn, prompt.tokens, kind="implied").signed
    with pytest.raises(InputError, match="kind='implied'"):
        attention_heads(ssm, prompt.tokens, kind="softmax")
    with pytest.raises(InputError, match="kind must be"):
        attention_heads(attn, prompt.tokens, kind="linear")


def test_single_pattern_and_row_views(prompt, attn, ssm):
    single = attention_pattern(attn, prompt.tokens, head=2)
    assert single.component == "AttentionPattern"
    torch.testing.assert_close(torch.tensor(single.props["attention"]), attn[2], atol=1e-5, rtol=0)
    with pytest.raises(InputError, match="head=7"):
        attention_pattern(attn, prompt.tokens, head=7)

    soft_row = attention_row_view(attn[0, -1], prompt.tokens)
    assert soft_row.component == "ColoredTokens" and not soft_row.signed
    assert soft_row.props["minValue"] == 0.0
    assert soft_row.props["values"][prompt.target] == pytest.approx(attn[0, -1, prompt.target].item(), abs=1e-6)
    ssm_row = attention_row_view(ssm[0, -1], prompt.tokens)
    assert ssm_row.signed and ssm_row.props["minValue"] == pytest.approx(-ssm[0, -1].abs().max().item())
    with pytest.raises(InputError, match="one row"):
        attention_row_view(attn[0], prompt.tokens)


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.rand(5), "head, query, key"),
        (torch.rand(2, 3, 4, 5, 5), "head, query, key"),
        (torch.full((1, 3, 3), float("nan")), "NaN"),
    ],
)
def test_bad_patterns(bad, match):
    with pytest.raises(InputError, match=match):
        attention_heads(bad, ["a"] * bad.shape[-1])


def test_rows_only_pattern_and_token_mismatch(prompt, attn):
    rows_only = attn[:, -1:, :]  # what model.pattern(..., rows=-1) returns per example
    with pytest.raises(InputError, match="attention_row_view"):
        attention_heads(rows_only, prompt.tokens)
    with pytest.raises(InputError, match="to_str_tokens"):
        attention_heads(attn, prompt.tokens[:-1])
    with pytest.raises(InputError, match="batch_index"):
        attention_heads(attn[None], prompt.tokens, batch_index=3)
    with pytest.raises(InputError, match="one name per head"):
        attention_heads(attn, prompt.tokens, head_names=["a"])


# --------------------------------------------------------------------------- offline HTML
def test_fragment_inlines_the_bundle_and_never_uses_a_cdn(prompt, attn, monkeypatch):
    import circuitsvis.utils.render as cv_render

    def no_network(*args, **kwargs):  # pragma: no cover - failing path
        raise AssertionError("the view must not probe the network")

    monkeypatch.setattr(cv_render, "internet_on", no_network)
    monkeypatch.setattr("urllib.request.urlopen", no_network)
    view = attention_heads(attn, prompt.tokens)
    html = view._repr_html_()
    assert "var CircuitsVis=" in html and "CircuitsVis.render(" in html
    assert "unpkg.com" not in html and not re.search(r"<script[^>]*\bsrc=", html)
    assert _closing_script_tags(html) == 1  # the bundle's own "</script>" string was neutralised
    assert "sourceMappingURL" not in html
    bare = view.fragment(include_js=False)
    assert "var CircuitsVis=" not in bare and f'id="{view.element_id}"' in bare


def test_tokens_cannot_break_out_of_the_script(attn):
    evil = ["</script><script>alert(1)</script>", "<!--", "&amp;"] + ["x"] * (attn.shape[-1] - 3)
    view = attention_heads(attn, evil)
    html = view.fragment(include_js=False)
    assert _closing_script_tags(html) == 1
    assert "alert(1)" in html and "<script>alert" not in html
    # the escaped JSON still decodes to the same tokens
    assert json_for_script(evil[0]).encode().decode("unicode_escape").strip('"') == evil[0]


def test_script_safe():
    assert script_safe('a="</script>";\n//# sourceMappingURL=x.js.map\n') == 'a="<\\/script>";\n'
    assert "</script" not in circuitsvis_js().lower()


def test_save_standalone_page(tmp_path, prompt, ssm):
    view = attention_heads(ssm, prompt.tokens, title="SSM layer 2")
    out = view.save(tmp_path / "view.html")
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and "SSM layer 2" in text and "var CircuitsVis=" in text
    assert [p.name for p in tmp_path.iterdir()] == ["view.html"]  # no temp files left behind


# --------------------------------------------------------------------------- long prompts
def _naive_downsample(p: torch.Tensor, m: int) -> torch.Tensor:
    n = p.shape[-1]
    bins = [(a, min(n, a + m)) for a in range(0, n, m)]
    out = torch.zeros(p.shape[0], len(bins), len(bins))
    for i, (_, qb) in enumerate(bins):
        for j, (ka, kb) in enumerate(bins):
            out[:, i, j] = p[:, qb - 1, ka:kb].sum(-1)
    return out


@settings(max_examples=25, deadline=None)
@given(n=st.integers(3, 70), max_tokens=st.integers(2, 40), seed=st.integers(0, 10_000))
def test_downsample_matches_reference_and_keeps_row_totals(n, max_tokens, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, n, n, generator=g).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf)
    p = logits.softmax(-1)
    fitted = fit_pattern(p, [f"t{i}" for i in range(n)], max_tokens=max_tokens, mode="downsample")
    if n <= max_tokens:
        assert fitted.note is None and torch.equal(fitted.pattern, p)
        return
    m = math.ceil(n / max_tokens)
    assert fitted.pattern.shape[-1] == len(fitted.tokens) == len(fitted.spans) == math.ceil(n / m) <= max_tokens
    torch.testing.assert_close(fitted.pattern, _naive_downsample(p, m), atol=1e-5, rtol=0)
    torch.testing.assert_close(fitted.pattern.sum(-1), torch.ones(fitted.pattern.shape[:-1]), atol=1e-5, rtol=0)
    assert fitted.spans[0][0] == 0 and fitted.spans[-1][1] == n
    assert "Downsampled" in fitted.note


def test_downsampled_sharp_head_stays_sharp():
    n, target = 300, 137
    p = torch.full((1, n, n), 0.0)
    p[0, :, 0] = 1.0
    p[0, -1] = 0.0
    p[0, -1, target] = 1.0
    tokens = [f"t{i}" for i in range(n)]
    view = attention_heads(p, tokens, max_tokens=60)
    shown = torch.tensor(view.props["attention"][0])
    assert shown.shape == (60, 60) and "300-token prompt" in view.note
    last = shown[-1]  # the final token's row, exact: all its mass on the target's bin
    assert int(last.argmax()) == target // 5 and last.max().item() == pytest.approx(1.0)
    assert last.sum().item() == pytest.approx(1.0)
    assert view.props["tokens"][target // 5] == "t135…t139"
    torch.testing.assert_close(shown[:-1, 0], torch.ones(59))  # the other rows attend to position 0


def test_crop_and_select(prompt, attn):
    n = len(prompt.tokens)
    cropped = fit_pattern(attn, prompt.tokens, max_tokens=10, mode="crop")
    assert cropped.tokens == prompt.tokens[-10:] and cropped.spans[0] == (n - 10, n - 9)
    torch.testing.assert_close(cropped.pattern, attn[:, -10:, -10:])
    assert "Cropped" in cropped.note
    win = fit_pattern(attn, prompt.tokens, window=(2, 8))
    assert win.tokens == prompt.tokens[2:8]
    keep = [*prompt.summaries, prompt.query]
    sel = attention_heads(attn, prompt.tokens, positions=keep)
    assert sel.props["tokens"] == ["\\n"] * len(prompt.summaries) + [" is"]
    idx = torch.tensor(sorted(keep))
    torch.testing.assert_close(torch.tensor(sel.props["attention"]), attn[:, idx][:, :, idx], atol=1e-5, rtol=0)
    assert f"Selected {len(keep)} of {n}" in sel.note
    with pytest.raises(IndexOutOfRangeError, match="window"):
        fit_pattern(attn, prompt.tokens, window=(5, n + 3))
    with pytest.raises(InputError, match="narrow the window"):
        fit_pattern(attn, prompt.tokens, window=(0, 20), max_tokens=10)
    with pytest.raises(IndexOutOfRangeError, match="positions"):
        fit_pattern(attn, prompt.tokens, positions=[0, n + 1])
    with pytest.raises(InputError, match="mode must be"):
        fit_pattern(attn, prompt.tokens, mode="zoom")

"""Circuits as graphs: the nodes and edges of any protocol model, and the layer-local runs that read them.

**Nodes.** ``embed`` (the residual entering layer 0), every head (``L{l}H{h}``: attention heads and SSM heads
alike, their output ``z_h`` through the out-projection columns of the head, ``z_h W_hᵀ``), a layer's short
convolution where it has one (``L{l}conv``), every MLP (``MLP{l}``) and ``logits``.  Inputs shared by a group of
heads are a node of their own, a *group* (``L{l}G{g}``): an SSM layer's ``B`` and ``C`` (Mamba-2: one per
``n_groups``; Mamba-1: one for the layer) and, under grouped-query attention, a KV head's ``k`` and ``v``
(``L{l}KV{g}``); gated DeltaNet's ``q`` and ``k`` heads likewise.  Such an input is attributed to the group, never
split among its heads by a rule nobody can check.

**Edges** run from a sender's output to one *input* of a receiver (:class:`Input`).  An input is one slice (a
head, a group, or the whole tensor) of one hook of the receiver's layer, and a *source* it is computed from:

* ``resid`` inputs are functions of the residual entering the layer alone: an attention head's ``q``, ``k``,
  ``v`` (and Qwen3-Next's output ``gate``); an SSM head's slices of the in-projection that do not pass the
  convolution (``gate`` = ``z``, Mamba-2's ``dt``, DeltaNet's ``beta`` and ``g``); the convolution's own input
  ``in`` (the in-projection's conv channels); the MLP's ``in`` (the normalised residual after the mixer) and the
  logits' ``in`` (the final normalised residual).  Their senders are every node that writes the residual
  before them.
* ``conv`` inputs are functions of the layer's convolution output alone: an SSM head's ``x`` (and Mamba-1's
  ``dt``, which ``x_proj`` reads from every channel), a group's ``B`` / ``C``, DeltaNet's ``q``, ``k``, ``v``.
  Their one sender is the layer's ``conv`` node.

Which source an input has is measured on the model, not assumed: the build perturbs the convolution output and
sees which hooks move (:func:`build_graph`).  The build also checks that the residual is the sum of the senders'
outputs (plus constants) on two prompts, and refuses a model where it is not (post-norm blocks, scaled or
parallel residual writes).

**Local runs** (:func:`local_run`): an input's value for any source value comes from running the model from
the layer's input (``start_at_layer``) with the source replaced and stopping once the hooks it needs have fired
(each copy of a stacked batch with its own source value), so the graph needs no family's internals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from gather_aggregate.core.errors import InputError, UnsupportedModelError
from gather_aggregate.core.protocol import HookedModel

Source = Literal["resid", "mid", "final", "conv"]

ATTN_INPUTS = ("q", "k", "v", "attn_gate")
SSM_INPUTS = ("conv_in", "gate", "dt", "x", "B", "C", "q", "k", "v", "beta", "g")
GROUPED = ("B", "C")  # always a group's (one group when the hook has no group axis)
#: how the module docstring and the tables name each hook's input
INPUT_NAME = {"attn_gate": "gate", "conv_in": "in"}


@dataclass(frozen=True)
class Node:
    name: str
    kind: Literal["embed", "head", "conv", "mlp", "logits", "group"]
    layer: int | None = None
    heads: tuple[int, ...] = ()  # a head's own index; a group's member heads (layer indices)


@dataclass(frozen=True)
class Input:
    """One input of a receiver: ``unit`` of the hook ``hook`` viewed as ``[batch, pos, n_units, width]``."""

    node: str
    name: str
    layer: int
    source: Source
    hook: str
    n_units: int
    unit: int

    @property
    def label(self) -> str:
        return f"{self.node}.{self.name}"


@dataclass(frozen=True)
class Sender:
    node: str
    kind: Literal["embed", "head", "mlp", "conv"]
    layer: int  # -1 for the embedding
    head: int = -1


@dataclass
class CircuitGraph:
    """Nodes, senders, inputs and the edge mask ``valid[input, sender]`` of one model."""

    nodes: list[Node]
    senders: list[Sender]
    inputs: list[Input]
    valid: Tensor  # bool [n_inputs, n_senders]
    out_proj: dict[int, tuple[str, Tensor]] = field(repr=False)  # layer -> (head hook, W [d_model, heads*d_head])
    d_head: dict[int, int] = field(repr=False)
    final_hook: str = ""
    final_read: str = ""
    mlp_layers: tuple[int, ...] = ()  # layers with an MLP output hook (a node or not, part of the residual)
    mlp_scale: dict[int, float] = field(default_factory=dict)  # the residual's multiplier of an MLP's output

    @property
    def n_edges(self) -> int:
        return int(self.valid.sum())

    def edges(self) -> list[tuple[str, str]]:
        """Every edge as ``(sender, "receiver.input")``, in ``(input, sender)`` order."""
        idx = self.valid.nonzero().tolist()
        return [(self.senders[s].node, self.inputs[i].label) for i, s in idx]

    def edge_index(self, edges: Sequence[tuple[str, str]]) -> list[tuple[int, int]]:
        """``(input, sender)`` indices of ``edges`` given as ``(sender, "receiver.input")``; an unknown one raises."""
        s_of = {s.node: i for i, s in enumerate(self.senders)}
        i_of = {x.label: i for i, x in enumerate(self.inputs)}
        out = []
        for e in edges:
            try:
                sender, receiver = e
                i, s = i_of[receiver], s_of[sender]
            except (KeyError, ValueError, TypeError):
                raise InputError(f"edge {e!r} is not in this graph; write edges as (sender, 'receiver.input'), e.g. "
                                 f"('L0H1', 'L1H0.k'), as graph.edges() lists them") from None
            if not bool(self.valid[i, s]):
                raise InputError(f"{sender} does not feed {receiver}: it writes the residual after it is read")
            out.append((i, s))
        return out

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise InputError(f"no node {name!r} in this graph (nodes look like 'L1H0', 'MLP0', 'L0conv', 'embed')")

    def sources(self) -> list[tuple[int, Source]]:
        """The stages of a forward in order: ``(layer, source)`` pairs that some input reads."""
        order = {"resid": 0, "conv": 1, "mid": 2, "final": 3}
        return sorted({(x.layer, x.source) for x in self.inputs}, key=lambda t: (t[0], order[t[1]]))

    def source_hook(self, layer: int, source: Source) -> str:
        if source == "resid":
            return f"blocks.{layer}.hook_resid_pre"
        if source == "conv":
            return f"blocks.{layer}.ssm.hook_conv_out"
        if source == "mid":
            return f"blocks.{layer}.hook_resid_mid"
        return self.final_hook


class _Stop(Exception):
    """Raised by the last hook a local run needs: the rest of the forward is not run."""


def view_units(t: Tensor, n_units: int) -> Tensor:
    """``t`` ``[batch, pos, ...]`` as ``[batch, pos, n_units, width]``."""
    return t.reshape(*t.shape[:2], n_units, -1)


def local_run(model: HookedModel, layer: int, resid_in: Tensor, capture: Sequence[str],
              override: tuple[str, Tensor] | None = None) -> dict[str, Tensor]:
    """The hooks ``capture`` of a forward started at ``layer`` from ``resid_in`` (``[rows, pos, d_model]``), with the
    hook ``override[0]`` replaced by ``override[1]``; the forward stops once every captured hook has fired.  Keeps
    autograd (the caller chooses the mode); the hooks are gone on return, also after an error."""
    want = set(capture)
    got: dict[str, Tensor] = {}

    def grabber(name: str) -> Callable:
        def grab(t: Tensor, hook: Any) -> None:
            got[name] = t  # keyed by the name asked: a bridge's alias fires under its target's name
            if want <= got.keys():
                raise _Stop

        return grab

    hooks: list[tuple[str, Callable]] = []
    if override is not None:
        value = override[1]

        def put(t: Tensor, hook: Any) -> Tensor:
            return value.to(t.dtype).reshape(t.shape)

        hooks.append((override[0], put))
    hooks += [(name, grabber(name)) for name in want]
    try:
        with model.hooks(fwd_hooks=hooks):
            model(resid_in, start_at_layer=layer)
    except _Stop:
        pass
    missing = want - got.keys()
    if missing:
        raise UnsupportedModelError(f"hooks {sorted(missing)} did not fire in layer {layer}'s forward; this model's "
                                    "layers cannot be read as a graph (report it with the model's config)")
    return got


def _units(name: str, shape: Sequence[int], n_heads: int) -> tuple[int, bool] | None:
    """``(n_units, is_group)`` for a hook tensor of a mixer with ``n_heads`` heads; ``None`` when no rule reads it."""
    n = shape[2]
    if name in GROUPED:
        return (n, True) if len(shape) == 4 else (1, True)
    if len(shape) == 4:
        if n == n_heads:
            return n, False
        return (n, True) if n_heads % n == 0 else None
    if len(shape) == 3:
        if n % n_heads == 0:
            return n_heads, False
        return (n, True) if n_heads % n == 0 else None
    return None


def build_graph(model: HookedModel, *, mlps: bool = True, tokens: Tensor | None = None) -> CircuitGraph:
    """The graph of ``model`` (see the module docstring).  ``mlps=False`` leaves the MLPs out as nodes: they run on the
    unpatched residual, so their outputs stay clean in every patched run (no ablation reaches them).  ``tokens`` are
    the prompts the checks run on (default: two random prompts of 6 tokens)."""
    from gather_aggregate.core.arguments import check_model

    check_model(model)
    names = set(getattr(model, "hook_dict", {}))
    if tokens is None:
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, model.d_vocab, (2, 6), generator=g)
    tokens = model.validate_tokens(tokens)
    n_layers = model.n_layers
    final_hook = f"blocks.{n_layers - 1}.hook_resid_post"
    final_read = next((h for h in ("ln_final.hook_out", "ln_final.hook_normalized") if h in names), None)
    if final_read is None or final_hook not in names:
        raise UnsupportedModelError(f"{type(model).__name__} has no final norm hook (ln_final.hook_normalized); "
                                    "its logits cannot be a graph node")
    all_names: list[str] = [f"blocks.{la}.hook_resid_pre" for la in range(n_layers)] + [final_hook, final_read]
    for info in model.layers:
        L = info.index
        all_names += [info.head_hook]
        all_names += [h for h in (f"blocks.{L}.attn.hook_{n}" for n in ATTN_INPUTS) if h in names]
        all_names += [h for h in (f"blocks.{L}.ssm.hook_{n}" for n in SSM_INPUTS + ("conv_out",)) if h in names]
        all_names += [h for h in (f"blocks.{L}.{n}" for n in ("hook_mlp_out", "hook_resid_mid", "ln2.hook_out",
                                                               "ln2.hook_normalized")) if h in names]
    all_names += [h for L in range(n_layers) for h in (f"blocks.{L}.hook_resid_post",) if h in names]
    all_names += [resume[0] for L in range(n_layers) if (resume := model.mixer_resume(L)) is not None]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=sorted(set(all_names)))
    nodes = [Node("embed", "embed")]
    senders = [Sender("embed", "embed", -1)]
    inputs: list[Input] = []
    n_before: list[int] = []  # per input: how many residual senders precede it
    out_proj: dict[int, tuple[str, Tensor]] = {}
    d_head: dict[int, int] = {}
    conv_sender: dict[int, int] = {}

    for info in model.layers:
        L = info.index
        resume = model.mixer_resume(L)
        if resume is None:
            raise UnsupportedModelError(f"layer {L} of {type(model).__name__} has no out-projection the graph can "
                                        "read (mixer_resume is None); its heads' outputs are not linear writes")
        scale = _write_scale(cache, f"blocks.{L}.hook_resid_pre", resume[0], f"blocks.{L}.hook_resid_mid")
        out_proj[L], d_head[L] = (info.head_hook, resume[1].detach() * scale), info.d_head
        # ---- receivers of this layer's mixer
        conv_hooks = [h for h in (f"blocks.{L}.ssm.hook_conv_in", f"blocks.{L}.ssm.hook_conv_out") if h in cache]
        conv_src: set[str] = set()
        if len(conv_hooks) == 2:
            conv_src = _conv_sourced(model, L, cache, names)
        layer_inputs: list[Input] = []
        for kind, prefix, allowed in (("attn", "attn", ATTN_INPUTS), ("ssm", "ssm", SSM_INPUTS)):
            heads = info.heads_of(kind)
            if not heads:
                continue
            for n in allowed:
                hook = f"blocks.{L}.{prefix}.hook_{n}"
                if hook not in cache:
                    continue
                if n == "conv_in":
                    nodes.append(Node(f"L{L}conv", "conv", L, tuple(heads)))
                    layer_inputs.append(Input(f"L{L}conv", "in", L, "resid", hook, 1, 0))
                    continue
                shape = tuple(cache[hook].shape)
                rule = _units(n, shape, len(heads))
                if rule is None:
                    raise UnsupportedModelError(f"hook {hook} {shape} of layer {L} ({len(heads)} {kind} heads) "
                                                "splits into neither heads nor groups; the graph cannot read it")
                n_units, is_group = rule
                source: Source = "conv" if hook in conv_src else "resid"
                per = len(heads) // n_units
                for u in range(n_units):
                    if is_group and per > 1 or n in GROUPED:
                        members = tuple(heads[u * per:(u + 1) * per]) if n_units > 1 else tuple(heads)
                        tag = "KV" if kind == "attn" else "G"
                        name = f"L{L}{tag}{u}"
                        if all(x.name != name for x in nodes):
                            nodes.append(Node(name, "group", L, members))
                    else:
                        name = f"L{L}H{heads[u]}"
                    layer_inputs.append(Input(name, INPUT_NAME.get(n, n), L, source, hook, n_units, u))
        if not layer_inputs:
            raise UnsupportedModelError(f"layer {L} of {type(model).__name__} exposes none of the input hooks the "
                                        f"graph reads (attn.hook_q/k/v, ssm.hook_conv_in/gate/dt/...)")
        for x in layer_inputs:
            inputs.append(x)
            n_before.append(-1 if x.source == "conv" else len(senders))
        for h in range(info.n_heads):
            nodes.append(Node(f"L{L}H{h}", "head", L, (h,)))
            senders.append(Sender(f"L{L}H{h}", "head", L, h))
        if f"L{L}conv" in {n.name for n in nodes}:
            conv_sender[L] = len(senders)
            senders.append(Sender(f"L{L}conv", "conv", L))
        # ---- the MLP
        mlp_out, mid = f"blocks.{L}.hook_mlp_out", f"blocks.{L}.hook_resid_mid"
        read = next((h for h in (f"blocks.{L}.ln2.hook_out", f"blocks.{L}.ln2.hook_normalized") if h in cache), None)
        if mlps and mlp_out in cache:
            if mid not in cache or read is None:
                raise UnsupportedModelError(f"layer {L}'s MLP has no input hooks (hook_resid_mid, ln2); pass "
                                            "mlps=False to keep MLPs out of the graph")
            nodes.append(Node(f"MLP{L}", "mlp", L))
            inputs.append(Input(f"MLP{L}", "in", L, "mid", read, 1, 0))
            n_before.append(len(senders))
            senders.append(Sender(f"MLP{L}", "mlp", L))
    nodes.append(Node("logits", "logits", n_layers - 1))
    inputs.append(Input("logits", "in", n_layers - 1, "final", final_read, 1, 0))
    n_before.append(len(senders))
    nodes.sort(key=lambda n: -1 if n.layer is None else n.layer)

    valid = torch.zeros(len(inputs), len(senders), dtype=torch.bool)
    for i, (x, nb) in enumerate(zip(inputs, n_before)):
        if x.source == "conv":
            valid[i, conv_sender[x.layer]] = True
        else:
            is_resid = torch.tensor([s.kind != "conv" for s in senders[:nb]], dtype=torch.bool)
            valid[i, :nb] = is_resid
    mlp_layers = tuple(L for L in range(n_layers) if f"blocks.{L}.hook_mlp_out" in cache)
    mlp_scale = {L: _write_scale(cache, f"blocks.{L}.hook_resid_mid", f"blocks.{L}.hook_mlp_out",
                                 f"blocks.{L}.hook_resid_post") for L in mlp_layers}
    graph = CircuitGraph(nodes, senders, inputs, valid, out_proj, d_head, final_hook, final_read, mlp_layers,
                         mlp_scale)
    _check_additive(model, graph, tokens)
    return graph


def _write_scale(cache: Any, before: str, write: str, after: str) -> float:
    """``c`` where the residual goes from ``before`` to ``after`` by adding ``c ×`` the hook ``write`` exactly (a
    μP residual multiplier, Granite-4's 0.5); 1.0 where the hooks are missing or no single ``c`` fits (the
    additivity check then decides)."""
    if before not in cache or write not in cache or after not in cache:
        return 1.0
    step, w = (cache[after] - cache[before]).double(), cache[write].double()
    den = float((w * w).sum())
    if den == 0.0:
        return 1.0
    c = float((step * w).sum()) / den
    fits = float((step - c * w).abs().max()) <= 1e-5 * (float(step.abs().max()) + 1e-6)
    return c if fits and abs(c - 1.0) > 1e-6 else 1.0


def scaled_writes(graph: CircuitGraph, values: dict[str, Tensor]) -> dict[str, Tensor]:
    """``values`` with each MLP output times the residual's multiplier of it (heads' multipliers are in ``W``)."""
    out = dict(values)
    for L, c in graph.mlp_scale.items():
        hook = f"blocks.{L}.hook_mlp_out"
        if c != 1.0 and hook in out:
            out[hook] = out[hook] * c
    return out


def _conv_sourced(model: HookedModel, layer: int, cache: Any, names: set[str]) -> set[str]:
    """The input hooks of ``layer`` that move when its convolution output moves (with the residual fixed)."""
    cands = [f"blocks.{layer}.ssm.hook_{n}" for n in SSM_INPUTS if n != "conv_in"]
    cands = [h for h in cands if h in names and h in cache]
    resid = cache[f"blocks.{layer}.hook_resid_pre"]
    conv = cache[f"blocks.{layer}.ssm.hook_conv_out"]
    g = torch.Generator().manual_seed(1)
    noise = torch.randn(conv.shape, generator=g).to(conv.device, conv.dtype) * (conv.abs().mean() + 1e-3)
    conv_hook = f"blocks.{layer}.ssm.hook_conv_out"
    with torch.no_grad():
        moved = local_run(model, layer, resid, cands, (conv_hook, conv + noise))
        found = {h for h in cands if not torch.allclose(moved[h], cache[h], atol=1e-6, rtol=1e-5)}
        # and nothing else: with the conv output held, a moved residual must leave them where they were
        shaken = resid + torch.randn(resid.shape, generator=g).to(resid.device, resid.dtype) * resid.abs().mean()
        held = local_run(model, layer, shaken, sorted(found), (conv_hook, conv))
    mixed = sorted(h for h in found if not torch.allclose(held[h], cache[h], atol=1e-6, rtol=1e-5))
    if mixed:
        raise UnsupportedModelError(f"hooks {mixed} of layer {layer} read both the residual and the short "
                                    "convolution's output; the graph cannot give them one source")
    return found


def sender_outputs(graph: CircuitGraph, cache: Any, layer: int | None = None) -> dict[str, Tensor]:
    """Each residual sender's output in residual space ``[batch, pos, d_model]`` from a cache of the sender hooks
    (heads: ``z_h W_hᵀ``).  Only for checks: estimators work in head space."""
    out = {"embed": cache["blocks.0.hook_resid_pre"]}
    for L, (hook, w) in graph.out_proj.items():
        z = cache[hook]
        dh = graph.d_head[L]
        for h in range(z.shape[2]):
            out[f"L{L}H{h}"] = z[:, :, h] @ w[:, h * dh:(h + 1) * dh].T.to(z.dtype)
        if f"blocks.{L}.hook_mlp_out" in cache:
            out[f"MLP{L}"] = cache[f"blocks.{L}.hook_mlp_out"] * graph.mlp_scale.get(L, 1.0)
    return out


def sender_hooks(graph: CircuitGraph) -> list[str]:
    """Hooks holding every sender's output (heads' ``z``, MLP outputs, the embedding, conv outputs)."""
    hooks = ["blocks.0.hook_resid_pre"] + [h for h, _ in graph.out_proj.values()]
    hooks += [f"blocks.{L}.hook_mlp_out" for L in graph.mlp_layers]
    for s in graph.senders:
        if s.kind == "conv":
            hooks.append(f"blocks.{s.layer}.ssm.hook_conv_out")
    return hooks


def _check_additive(model: HookedModel, graph: CircuitGraph, tokens: Tensor) -> None:
    """Refuse a model whose residual is not the sum of its senders' outputs plus a constant."""
    g = torch.Generator().manual_seed(2)
    other = torch.randint(0, model.d_vocab, tuple(tokens.shape), generator=g).to(tokens.device)
    hooks = sorted(set(sender_hooks(graph) + [f"blocks.{L}.hook_resid_pre" for L in range(model.n_layers)]
                       + [graph.final_hook] + [f"blocks.{L}.hook_mlp_out" for L in range(model.n_layers)
                                               if f"blocks.{L}.hook_mlp_out" in model.hook_dict]))
    rests = []
    for t in (tokens, other):
        with torch.no_grad():
            _, cache = model.run_with_cache(t, names_filter=hooks)
        outs = sender_outputs(graph, cache)
        total = outs["embed"].double()
        rest = []
        for L in range(1, model.n_layers + 1):
            for name, v in outs.items():
                if name.startswith(f"L{L - 1}H") or name == f"MLP{L - 1}":
                    total = total + v.double()
            here = cache[f"blocks.{L}.hook_resid_pre"] if L < model.n_layers else cache[graph.final_hook]
            rest.append(here.double() - total)
        rests.append(rest)
    for L, (a, b) in enumerate(zip(*rests)):
        scale = float(a.abs().max() + 1)
        if (a.mean((0, 1)) - b.mean((0, 1))).abs().max() > 1e-4 * scale or (a - a.mean((0, 1))).abs().max() > \
                1e-4 * scale:
            raise UnsupportedModelError(f"the residual entering layer {L + 1} of {type(model).__name__} is not the sum "
                                        "of the heads', MLPs' and embedding's outputs (a norm, scale or parallel "
                                        "write after the heads); its edges cannot be read from the residual")

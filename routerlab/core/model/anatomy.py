"""Where transformers' module paths live: the per-family layer anatomy, and the router wrappers.

`Anatomy` resolves once per model the pieces the engine needs (embedding, decoder layers, their
norms, attention projections, rotary embeddings, final norm, head). Wrappers (`RoutedAttention`,
`RoutedMLP`, `RoutedBlock`) hold `.base` (the original module) and `.router`, in the PEFT style,
so `print(model)` shows the routers and `detach_routers` puts the original objects back.

Knows nothing about decoding, KV policies or the UI. Every transformers-version detail (layer
attribute names, the `(output, weights)` return of attention, the `cache` keyword) stays here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from routerlab.core.base.errors import RouterLabError
from routerlab.core.base.precision import needs_upcast
from routerlab.core.kernels.rotary import rope_tables
from routerlab.core.kernels.weights import LowBitPlan, Weight, fuse_linears
from routerlab.core.routing.router import Router, RouterSet

# Families whose decoder layer is pre-norm: h += attn(ln1(h)); h += mlp(ln2(h)).
PRE_NORM = {"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "mixtral"}
# Gemma 3 adds a norm after each sub-layer too ("sandwich" norms).
SANDWICH = {"gemma3_text", "gemma3"}
SUPPORTED = PRE_NORM | SANDWICH


class RMSNorm:
    """A pre-norm family's RMSNorm, x / rms(x) * w, as one fused LayerNorm kernel.

    torch's CPU rms_norm runs about ten small ops (18 us a call here, 61 calls a decode step); a
    LayerNorm is one kernel. The LayerNorm of [x, -x] has mean 0 and variance mean(x^2), so the
    first half of its output is x / sqrt(mean(x^2) + eps): the RMSNorm, scaled by the first half of
    its weight. transformers normalises in fp32, rounds, then scales; this rounds once (within one
    bf16 step of it, equal in fp32). The module's weight is read when the engine is built.
    """

    def __init__(self, module: nn.Module):
        self.module = module  # the original, for print() and the HF forward
        w = module.weight.detach()
        self.size, self.eps = w.shape[-1], module.variance_epsilon
        self.weight = torch.cat([w, torch.zeros_like(w)])  # (2 D,): the second half's output is dropped

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        d = self.size
        return F.layer_norm(torch.cat([x, -x], dim=-1), (2 * d,), self.weight, None, self.eps)[..., :d]  # (..., D), strided


def fast_norm(module: nn.Module | None, family: str):
    """The norm as the engine calls it: a fused RMSNorm for the pre-norm families (x * w / rms(x));
    the module itself elsewhere (Gemma 3 scales by 1 + w, in its own order of roundings)."""
    if module is None or family not in PRE_NORM or not hasattr(module, "variance_epsilon"):
        return module
    return RMSNorm(module)


def base_of(module: nn.Module) -> nn.Module:
    """The original module behind a RouterLab wrapper (or the module itself)."""
    while isinstance(module, Routed):
        module = module.base
    return module


@dataclass(frozen=True)
class AttentionParts:
    """One attention sub-layer, as the engine computes it (no HF forward involved).

    `qkv` stacks the query, key and value projections (rows: q, then k, then v), so a token that
    runs attention costs one product; the original modules' weights are views of its dense weight.
    `q` and `kv` are its parts (a token that skips under `kv` pays only for keys and values); each
    holds its own low-bit copy when the model has them (weights.py).
    """

    qkv: Weight  # (q_size + 2 * kv_size, D)
    q: Weight  # (q_size, D)
    kv: Weight  # (2 * kv_size, D)
    o: Weight  # (D, q_size)
    q_size: int  # n_heads * head_dim
    kv_size: int  # n_kv_heads * head_dim
    q_norm: Callable | None  # per-head norms (Qwen 3, Gemma 3): fast_norm of the module
    k_norm: Callable | None
    n_heads: int
    n_kv_heads: int
    head_dim: int
    scaling: float
    sliding_window: int | None
    rope_key: str  # which rotary table this layer uses ("default", or Gemma 3's layer type)
    upcast: bool  # compute long inputs in fp32 (weights.linear): bf16 weights on a CPU without bf16 units


@dataclass(frozen=True)
class LayerParts:
    attn: AttentionParts
    attn_norm: Callable  # the norm in front of attention (router input for attention and block)
    attn_post_norm: nn.Module | None  # Gemma 3: norm applied to the attention output
    mlp: nn.Module  # the original MLP; called as is when it is not a plain gated MLP (MoE)
    mlp_norm: Callable  # the norm in front of the MLP (router input for mlp)
    mlp_post_norm: nn.Module | None
    gate_up: Weight | None  # (2 * I, D) gate rows then up rows, for gated MLPs: down(act(gate x) * up x)
    down: Weight | None  # (D, I), for gated MLPs
    upcast: bool

    @property
    def plain(self) -> bool:
        """A pre-norm layer with a gated MLP and plain global attention: what the one-token step computes."""
        a = self.attn
        return (self.gate_up is not None and self.attn_post_norm is None and self.mlp_post_norm is None
                and a.q_norm is None and a.k_norm is None and not a.sliding_window)


class Anatomy:
    """The pieces of a decoder-only causal LM that the engine runs, resolved once.

    `lowbit` (weights.LowBitPlan) gives each linear map a low-bit copy for decode steps: the model
    file's own codes, or a requantisation of the dense weights. The kernels are CPU ones: on another
    device the plan is not used (`self.lowbit` is None then).
    """

    def __init__(self, model: nn.Module, lowbit: LowBitPlan | None = None):
        self.model = model
        text = model.config.get_text_config()
        self.config = text
        self.family = text.model_type
        if self.family not in SUPPORTED:
            raise RouterLabError(
                f"Architecture {self.family!r} is not supported yet.",
                f"Supported: {', '.join(sorted(SUPPORTED))}.",
            )
        if getattr(text, "attn_logit_softcapping", None):
            raise RouterLabError("Attention logit soft-capping (Gemma 2) is not supported.")
        inner = model.model
        self.embed = inner.embed_tokens
        self.final_norm = fast_norm(inner.norm, model.config.get_text_config().model_type)
        self.lm_head = model.lm_head
        self.rotary = inner.rotary_emb
        self.dynamic_rope = "dynamic" in str(getattr(self.rotary, "rope_type", "default"))
        self._rope_full: dict[torch.dtype, tuple[int, dict]] = {}  # dtype -> (n, kind -> tables of positions 0..n-1)
        self.final_softcap = getattr(text, "final_logit_softcapping", None)
        self.layer_types = list(getattr(text, "layer_types", None) or ["default"] * text.num_hidden_layers)
        self.per_type_rope = self.family in SANDWICH
        param = next(model.parameters())
        self.dtype = param.dtype
        self.upcast = needs_upcast(param.dtype, str(param.device))
        self.lowbit = lowbit if lowbit is not None and param.device.type == "cpu" else None
        # parameter names of the bare model (wrappers add '.base' to a path), to find a weight's low-bit codes
        self._module_names = {id(m): n.replace(".base", "") for n, m in model.named_modules()}
        self.layers = [self._parts(base_of(layer), i) for i, layer in enumerate(inner.layers)]
        head = self.lm_head
        self.head = self._weight([self._name(head)], head.weight.detach(), head.bias)
        self.n_layers = len(self.layers)
        self.hidden_size = text.hidden_size
        self.plain = all(p.plain for p in self.layers)  # every layer can take the one-token step (engine.forward)

    def _name(self, module: nn.Module) -> str:
        """The parameter name of a module's weight, e.g. 'model.layers.0.self_attn.q_proj.weight'."""
        return f"{self._module_names.get(id(module), '?')}.weight"

    def _weight(self, names: list[str], dense: torch.Tensor, bias: torch.Tensor | None = None) -> Weight:
        low = self.lowbit.low(names, dense) if self.lowbit is not None else None
        return Weight(dense, None if bias is None else bias.detach(), low, names=tuple(names) if low is not None else ())

    def _parts(self, layer: nn.Module, index: int) -> LayerParts:
        attn = base_of(layer.self_attn)
        cfg = self.config
        head_dim = attn.head_dim
        window = getattr(attn, "sliding_window", None) if hasattr(attn, "sliding_window") else getattr(cfg, "sliding_window", None)
        q_name, k_name, v_name, o_name = (self._name(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj))
        qkv_weight, qkv_bias = fuse_linears([attn.q_proj, attn.k_proj, attn.v_proj])
        qkv = self._weight([q_name, k_name, v_name], qkv_weight, qkv_bias)
        q_size = attn.q_proj.out_features
        q, kv = qkv.rows(0, q_size), qkv.rows(q_size, qkv_weight.shape[0])
        parts = AttentionParts(
            qkv=qkv,
            q=self._weight([q_name], q.dense, q.bias),
            kv=self._weight([k_name, v_name], kv.dense, kv.bias),
            o=self._weight([o_name], attn.o_proj.weight.detach(), attn.o_proj.bias),
            q_size=q_size,
            kv_size=attn.k_proj.out_features,
            q_norm=fast_norm(getattr(attn, "q_norm", None), self.family),
            k_norm=fast_norm(getattr(attn, "k_norm", None), self.family),
            n_heads=cfg.num_attention_heads,
            n_kv_heads=cfg.num_key_value_heads,
            head_dim=head_dim,
            scaling=float(attn.scaling),
            sliding_window=window,
            rope_key=self.layer_types[index] if self.per_type_rope else "default",
            upcast=self.upcast,
        )
        sandwich = self.family in SANDWICH
        mlp = base_of(layer.mlp)
        gated = all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn"))
        gate_up = down = None
        if gated:
            names = [self._name(mlp.gate_proj), self._name(mlp.up_proj)]
            gate_up = self._weight(names, fuse_linears([mlp.gate_proj, mlp.up_proj])[0])
            down = self._weight([self._name(mlp.down_proj)], mlp.down_proj.weight.detach(), mlp.down_proj.bias)
        return LayerParts(
            attn=parts,
            attn_norm=fast_norm(layer.input_layernorm, self.family),
            attn_post_norm=layer.post_attention_layernorm if sandwich else None,
            mlp=mlp,
            mlp_norm=layer.pre_feedforward_layernorm if sandwich else fast_norm(layer.post_attention_layernorm, self.family),
            mlp_post_norm=layer.post_feedforward_layernorm if sandwich else None,
            gate_up=gate_up,
            down=down,
            upcast=self.upcast,
        )

    def rope(self, h: torch.Tensor, positions: torch.Tensor, top: int | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Rotary tables for `positions` (T,) in `kernels.rope_tables` form, one per rotary kind used.

        Cut from tables of positions 0..n-1 computed once by the model's own rotary module (n doubles
        when a position goes past it), so a decode step indexes instead of recomputing; exact, since
        the module computes each position on its own. Rotary kinds whose frequencies depend on the
        sequence length ("dynamic") are computed per forward.
        """
        if self.dynamic_rope:
            pos = positions.view(1, -1)
            if not self.per_type_rope:
                return {"default": rope_tables(*self.rotary(h, pos))}
            return {kind: rope_tables(*self.rotary(h, pos, kind)) for kind in set(self.layer_types)}
        # a forward's positions increase; a decode batch's rows come in any order. `top` (their max, when the caller
        # knows it) spares a GPU the host read of positions.max()
        need = (int(positions.max()) if top is None else top) + 1
        full = self._rope_full.get(h.dtype)
        if full is None or full[0] < need:
            n = max(need, 2 * full[0] if full else 256)
            pos = torch.arange(n, device=h.device).view(1, -1)
            kinds = ["default"] if not self.per_type_rope else sorted(set(self.layer_types))
            args = [(kind,) if self.per_type_rope else () for kind in kinds]
            full = (n, {kind: rope_tables(*self.rotary(h, pos, *a)) for kind, a in zip(kinds, args)})
            self._rope_full[h.dtype] = full  # one assignment: a request on another thread sees old or new
        return {kind: (cos.index_select(2, positions), sin.index_select(2, positions)) for kind, (cos, sin) in full[1].items()}

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.final_norm(h), self.upcast)
        if self.final_softcap:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits

    def decode_weight_bytes(self) -> int:
        """Bytes of weights one decode step of the full model reads: each linear map's low-bit copy where it
        has one, else its dense weight (the embedding's one-row lookup and the norms are left out)."""
        maps = [self.head] + [w for p in self.layers for w in (p.attn.qkv, p.attn.o, p.gate_up, p.down) if w is not None]
        total = sum(w.nbytes for w in maps)
        for p in self.layers:
            if p.gate_up is None:  # a MoE block: its own modules, dense
                total += sum(t.numel() * t.element_size() for t in p.mlp.parameters())
        return total

    # -- cost figures, for savings() and the ideal-speedup estimate ------------------------------
    def costs(self, dtype_bytes: int) -> dict[str, float]:
        """Per-token FLOPs of one layer's pieces (2 x multiply-adds) and one token's KV bytes per layer."""
        a = self.layers[0].attn
        d = self.hidden_size
        mlp = self.layers[0].mlp
        params = sum(p.numel() for p in mlp.parameters())  # views of the fused weights count once, as before
        experts = getattr(self.config, "num_experts", None) or getattr(self.config, "num_local_experts", None)
        if experts:  # a MoE block runs top-k experts per token, not all of them
            top_k = self.config.num_experts_per_tok
            expert_params = sum(p.numel() for n, p in mlp.named_parameters() if n.startswith("experts."))
            params = params - expert_params + expert_params * top_k / experts
        return {
            "q": 2.0 * d * a.n_heads * a.head_dim,
            "k": 2.0 * d * a.n_kv_heads * a.head_dim,
            "v": 2.0 * d * a.n_kv_heads * a.head_dim,
            "o": 2.0 * a.n_heads * a.head_dim * d,
            "mlp": 2.0 * params,
            "score_per_ctx": 4.0 * a.n_heads * a.head_dim,
            "head": 2.0 * d * self.config.vocab_size,
            "kv_bytes": 2.0 * a.n_kv_heads * a.head_dim * dtype_bytes,
        }


# -- wrappers: visible in print(model), reversible, HF-forward compatible ----------------------
class Routed(nn.Module):
    """Base of the wrappers: `.base` is the original module, `.router` the Router in front of it.

    Called through the plain transformers forward, a wrapper applies the router with `mask`
    semantics at a fixed threshold (the engine does the real skipping and takes its threshold
    per request; it reads `.base` and never calls these forwards).
    """

    def __init__(self, base: nn.Module, router: Router, threshold: float = 0.5):
        super().__init__()
        self.base = base
        self.router = router
        self.threshold = threshold  # fixed at attach time, for the HF-forward path only

    def gate(self, x: torch.Tensor) -> torch.Tensor:
        return (self.router(x) >= self.threshold).to(x.dtype).unsqueeze(-1)  # (B, T, 1)

    def extra_repr(self) -> str:
        return f"threshold={self.threshold}"


class RoutedAttention(Routed):
    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        out, weights = self.base(hidden_states, *args, **kwargs)  # transformers 5: (output, weights)
        return out * self.gate(hidden_states), weights


class RoutedMLP(Routed):
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.base(hidden_states) * self.gate(hidden_states)


class RoutedBlock(Routed):
    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        g = self.gate(self.base.input_layernorm(hidden_states))
        out = self.base(hidden_states, *args, **kwargs)  # transformers 5: a tensor
        return hidden_states + g * (out - hidden_states)


_WRAPPERS = {"attention": ("self_attn", RoutedAttention), "mlp": ("mlp", RoutedMLP), "block": (None, RoutedBlock)}


def attach_routers(model: nn.Module, routers: RouterSet, threshold: float = 0.5) -> nn.Module:
    """Wrap the routed sub-layers of `model` in place. Returns `model`."""
    Anatomy(model)  # validates the family
    detach_routers(model)
    layers = model.model.layers
    attr, wrapper = _WRAPPERS[routers.config.target]
    for i in routers.config.layers:
        router = routers.get(i)
        if attr is None:
            layers[i] = wrapper(layers[i], router, threshold)
        else:
            setattr(layers[i], attr, wrapper(getattr(layers[i], attr), router, threshold))
    return model


def detach_routers(model: nn.Module) -> nn.Module:
    """Put every original sub-layer back (the very same objects). Returns `model`."""
    layers = model.model.layers
    for i in range(len(layers)):
        layers[i] = base_of(layers[i])
        for attr in ("self_attn", "mlp"):
            setattr(layers[i], attr, base_of(getattr(layers[i], attr)))
    return model

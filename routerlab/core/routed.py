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

import torch
from torch import nn

from routerlab.core.errors import RouterLabError
from routerlab.core.kernels import fuse_linears, linear, rope_tables
from routerlab.core.precision import needs_upcast
from routerlab.core.router import Router, RouterSet

# Families whose decoder layer is pre-norm: h += attn(ln1(h)); h += mlp(ln2(h)).
PRE_NORM = {"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "mixtral"}
# Gemma 3 adds a norm after each sub-layer too ("sandwich" norms).
SANDWICH = {"gemma3_text", "gemma3"}
SUPPORTED = PRE_NORM | SANDWICH


def base_of(module: nn.Module) -> nn.Module:
    """The original module behind a RouterLab wrapper (or the module itself)."""
    while isinstance(module, Routed):
        module = module.base
    return module


@dataclass(frozen=True)
class AttentionParts:
    """One attention sub-layer, as the engine computes it (no HF forward involved).

    `qkv_weight` stacks the query, key and value projections (rows: q, then k, then v), so a token
    that runs attention costs one product; the original modules' weights are views of it.
    """

    qkv_weight: torch.Tensor  # (q_size + 2 * kv_size, D)
    qkv_bias: torch.Tensor | None
    q_size: int  # n_heads * head_dim
    kv_size: int  # n_kv_heads * head_dim
    o_proj: nn.Linear
    q_norm: nn.Module | None
    k_norm: nn.Module | None
    n_heads: int
    n_kv_heads: int
    head_dim: int
    scaling: float
    sliding_window: int | None
    rope_key: str  # which rotary table this layer uses ("default", or Gemma 3's layer type)
    upcast: bool  # compute long inputs in fp32 (kernels.linear): bf16 weights on a CPU without bf16 units

    def q_weight(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        b = self.qkv_bias
        return self.qkv_weight[: self.q_size], None if b is None else b[: self.q_size]

    def kv_weight(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        b = self.qkv_bias
        return self.qkv_weight[self.q_size :], None if b is None else b[self.q_size :]


@dataclass(frozen=True)
class LayerParts:
    attn: AttentionParts
    attn_norm: nn.Module  # the norm in front of attention (router input for attention and block)
    attn_post_norm: nn.Module | None  # Gemma 3: norm applied to the attention output
    mlp: nn.Module  # the original MLP; called as is when it is not a plain gated MLP (MoE)
    mlp_norm: nn.Module  # the norm in front of the MLP (router input for mlp)
    mlp_post_norm: nn.Module | None
    gate_up: torch.Tensor | None  # (2 * I, D) gate rows then up rows, for gated MLPs: down(act(gate x) * up x)
    upcast: bool


class Anatomy:
    """The pieces of a decoder-only causal LM that the engine runs, resolved once."""

    def __init__(self, model: nn.Module):
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
        self.final_norm = inner.norm
        self.lm_head = model.lm_head
        self.rotary = inner.rotary_emb
        self.final_softcap = getattr(text, "final_logit_softcapping", None)
        self.layer_types = list(getattr(text, "layer_types", None) or ["default"] * text.num_hidden_layers)
        self.per_type_rope = self.family in SANDWICH
        param = next(model.parameters())
        self.dtype = param.dtype
        self.upcast = needs_upcast(param.dtype, str(param.device))
        self.layers = [self._parts(base_of(layer), i) for i, layer in enumerate(inner.layers)]
        self.n_layers = len(self.layers)
        self.hidden_size = text.hidden_size

    def _parts(self, layer: nn.Module, index: int) -> LayerParts:
        attn = base_of(layer.self_attn)
        cfg = self.config
        head_dim = attn.head_dim
        window = getattr(attn, "sliding_window", None) if hasattr(attn, "sliding_window") else getattr(cfg, "sliding_window", None)
        qkv_weight, qkv_bias = fuse_linears([attn.q_proj, attn.k_proj, attn.v_proj])
        parts = AttentionParts(
            qkv_weight=qkv_weight,
            qkv_bias=qkv_bias,
            q_size=attn.q_proj.out_features,
            kv_size=attn.k_proj.out_features,
            o_proj=attn.o_proj,
            q_norm=getattr(attn, "q_norm", None),
            k_norm=getattr(attn, "k_norm", None),
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
        return LayerParts(
            attn=parts,
            attn_norm=layer.input_layernorm,
            attn_post_norm=layer.post_attention_layernorm if sandwich else None,
            mlp=mlp,
            mlp_norm=layer.pre_feedforward_layernorm if sandwich else layer.post_attention_layernorm,
            mlp_post_norm=layer.post_feedforward_layernorm if sandwich else None,
            gate_up=fuse_linears([mlp.gate_proj, mlp.up_proj])[0] if gated else None,
            upcast=self.upcast,
        )

    def rope(self, h: torch.Tensor, positions: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Rotary tables for `positions` (T,) in `kernels.rope_tables` form, one per rotary kind used."""
        pos = positions.view(1, -1)
        if not self.per_type_rope:
            return {"default": rope_tables(*self.rotary(h, pos))}
        return {kind: rope_tables(*self.rotary(h, pos, kind)) for kind in set(self.layer_types)}

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        logits = linear(self.final_norm(h), self.lm_head.weight, self.lm_head.bias, self.upcast)
        if self.final_softcap:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits

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

"""Load a base model and its tokenizer: the embedded default, a hub id or a local folder; tiny models for tests.

Knows nothing about routers or the engine.
"""

from __future__ import annotations

import torch
import transformers

# -- tiny random-init models, one per supported architecture (tests, no downloads) --------------
TINY_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "qwen2_moe", "mixtral")

_TINY_COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)
_TINY_EXTRA = {
    "llama": dict(model_type="llama"),
    "mistral": dict(model_type="mistral", sliding_window=None),
    "qwen2": dict(model_type="qwen2"),
    "qwen3": dict(model_type="qwen3", head_dim=16),
    "gemma3": dict(
        model_type="gemma3_text",
        head_dim=16,
        sliding_window=6,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        query_pre_attn_scalar=16,
    ),
    "qwen2_moe": dict(
        model_type="qwen2_moe",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        decoder_sparse_step=1,
    ),
    "mixtral": dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
}


def tiny_model(family: str = "llama", seed: int = 0, **overrides) -> transformers.PreTrainedModel:
    """A random-init causal LM of `family` with 4 layers and hidden size 64, in eval mode, fp32."""
    if family not in _TINY_EXTRA:
        raise ValueError(f"unknown tiny family {family!r}; choose from {TINY_FAMILIES}")
    kwargs = {**_TINY_COMMON, **_TINY_EXTRA[family], **overrides}
    model_type = kwargs.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()

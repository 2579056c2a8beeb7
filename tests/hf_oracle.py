"""transformers as the tests' reference: Hugging Face twins of specasr's own Whisper models.

specasr runs its own modules (`specasr.models.whisper`); these helpers build the equivalent
`WhisperForConditionalGeneration` so tests can compare logits, encoder states and greedy
`generate()` tokens against the reference implementation.
"""

from __future__ import annotations

import weakref

import torch

_TWINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def hf_config(dims, tokenizer):
    """A WhisperConfig with `dims` (specasr.models.whisper.WhisperDims)."""
    from transformers import WhisperConfig

    from specasr.models.convert import whisper_config

    return WhisperConfig(
        **whisper_config(
            tokenizer,
            d_model=dims.d_model,
            encoder_layers=dims.encoder_layers,
            decoder_layers=dims.decoder_layers,
            encoder_heads=dims.encoder_attention_heads,
            decoder_heads=dims.decoder_attention_heads,
            ffn_dim=dims.decoder_ffn_dim,
            n_mels=dims.num_mel_bins,
            vocab_size=dims.vocab_size,
            max_source_positions=dims.max_source_positions,
            max_target_positions=dims.max_target_positions,
        )
    )


def hf_twin(model, tokenizer, generation_config=None):
    """The Hugging Face model with exactly `model`'s weights (built once per model)."""
    from transformers import WhisperForConditionalGeneration

    twin = _TWINS.get(model)
    if twin is None:
        cfg = hf_config(model.config, tokenizer)
        cfg.tie_word_embeddings = model.proj_out.weight is model.model.decoder.embed_tokens.weight
        with torch.device("meta"):
            twin = WhisperForConditionalGeneration(cfg)
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}  # CPU forms hold views
        twin.load_state_dict(state, strict=True, assign=True)
        if cfg.tie_word_embeddings:
            twin.proj_out.weight = twin.model.decoder.embed_tokens.weight
        if generation_config is not None:
            twin.generation_config = generation_config
        twin = twin.eval().requires_grad_(False)
        _TWINS[model] = twin
    return twin


def own_from_hf(hf_model, generation=None):
    """specasr's Whisper with `hf_model`'s weights (for random test models built with transformers)."""
    from specasr.models.whisper import Generation, WhisperDims, from_tensors

    dims = WhisperDims.from_dict(hf_model.config.to_dict())
    gen = generation or Generation(
        tuple(getattr(hf_model.generation_config, "suppress_tokens", None) or ()),
        tuple(getattr(hf_model.generation_config, "begin_suppress_tokens", None) or ()),
    )
    model = from_tensors(dims, hf_model.state_dict(), gen)
    _TWINS[model] = hf_model
    return model


def hf_logits(model, tokenizer, states: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The reference decoder's logits [B, T, V] for tokens [B, T] on encoder states [B, S, d]."""
    twin = hf_twin(model, tokenizer)
    with torch.inference_mode():
        out = twin.model.decoder(input_ids=tokens, encoder_hidden_states=states, use_cache=False)
        return twin.proj_out(out.last_hidden_state)


__all__ = ["hf_config", "hf_logits", "hf_twin", "own_from_hf"]

"""Random tiny Whisper pairs with a real tokenizer, for fast decoding tests.

The models are specasr's own (`specasr.models.whisper`), initialised by transformers'
random Whisper initialisation and converted; `hf_oracle.hf_twin` gives the reference twin.

The target and the draft are initialised from different seeds, so the draft agrees with
the target rarely: the speculative loop's rejection paths get exercised constantly.
"""

from __future__ import annotations

import json

import torch
from hf_oracle import own_from_hf

from specasr.models.convert import whisper_config, whisper_generation_config
from specasr.models.loading import ModelPair, offline_files
from specasr.tokenizer import Tokenizer

N_TIMESTAMPS = 1501  # <|0.00|> ... <|30.00|>


def _random_model(tok: Tokenizer, ct2_config: dict, seed: int, decoder_layers: int, d_model: int = 64):
    from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration

    cfg = WhisperConfig(
        **whisper_config(
            tok,
            d_model=d_model,
            encoder_layers=2,
            decoder_layers=decoder_layers,
            encoder_heads=4,
            decoder_heads=4,
            ffn_dim=2 * d_model,
            n_mels=80,
            vocab_size=tok.timestamp_begin + N_TIMESTAMPS,
        )
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = WhisperForConditionalGeneration(cfg)
    model.generation_config = GenerationConfig(**whisper_generation_config(tok, ct2_config))
    return own_from_hf(model.eval().requires_grad_(False))


def random_tiny_pair(
    seed: int = 0,
    draft_layers: int = 1,
    tokenizer: str = "base",
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> ModelPair:
    """A random target (d_model 64, 2+2 layers, 4 heads) and an independently random draft
    (seed + 1, `draft_layers` decoder layers), sharing the real tokenizer and suppress lists
    of the offline preset `tokenizer` ("base": vocab 51865, "tiny.en": 51864)."""
    files = offline_files(tokenizer)
    tok = Tokenizer.from_file(files.tokenizer)
    ct2_config = json.loads(files.config.read_text())
    dev = torch.device(device)
    target = _random_model(tok, ct2_config, seed, 2).to(dev, dtype)
    draft = _random_model(tok, ct2_config, seed + 1, draft_layers).to(dev, dtype)
    gen = target.generation
    return ModelPair(
        target=target,
        draft=draft,
        tokenizer=tok,
        device=dev,
        dtype=dtype,
        shared_encoder=False,
        n_mels=80,
        suppress_tokens=tuple(gen.suppress_tokens),
        begin_suppress_tokens=tuple(gen.begin_suppress_tokens),
        target_name=f"random-tiny-{seed}",
        draft_name=f"random-tiny-{seed + 1}",
    )

"""A random Whisper pair over a toy vocabulary of a few dozen tokens.

Small enough to enumerate the target's exact distribution over short continuations, which
is what the sampling-exactness test compares against.
"""

from __future__ import annotations

import torch
from hf_oracle import own_from_hf
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import WordLevel

from specasr.models.convert import whisper_config
from specasr.models.loading import ModelPair
from specasr.tokenizer import Tokenizer

TOY_FRAMES = 20  # mel frames per toy window (real Whisper: 3000): keeps huge batches cheap

SPECIALS = [
    "<|endoftext|>",
    "<|startoftranscript|>",
    "<|en|>",
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nocaptions|>",
    "<|notimestamps|>",
]


def toy_tokenizer(n_words: int = 12) -> Tokenizer:
    vocab = {f"w{i}": i for i in range(n_words)}
    for j, s in enumerate(SPECIALS):
        vocab[s] = n_words + j
    hf = HFTokenizer(WordLevel(vocab, unk_token="w0"))
    hf.add_special_tokens(SPECIALS)
    return Tokenizer(hf)


def _model(tok: Tokenizer, seed: int, layers: int, sharpness: float):
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    cfg = WhisperConfig(
        **whisper_config(
            tok,
            d_model=32,
            encoder_layers=1,
            decoder_layers=layers,
            encoder_heads=2,
            decoder_heads=2,
            ffn_dim=64,
            n_mels=80,
            vocab_size=tok.timestamp_begin,
            max_source_positions=TOY_FRAMES // 2,
        )
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = WhisperForConditionalGeneration(cfg)
        # an untied, larger output projection: peaked next-token distributions that vary with
        # the context (the tied one mostly repeats the input token)
        weight = torch.randn(tok.timestamp_begin, 32) * sharpness
        model.proj_out.weight = torch.nn.Parameter(weight, requires_grad=False)
    return own_from_hf(model.eval().requires_grad_(False))


def toy_pair(seed: int = 0, sharpness: float = 0.3) -> ModelPair:
    tok = toy_tokenizer()
    target = _model(tok, seed, 2, sharpness)
    draft = _model(tok, seed + 1, 1, sharpness)
    return ModelPair(
        target=target,
        draft=draft,
        tokenizer=tok,
        device=torch.device("cpu"),
        dtype=torch.float32,
        shared_encoder=False,
        n_mels=80,
        suppress_tokens=(),
        begin_suppress_tokens=(tok.eot,),
        target_name="toy",
        draft_name="toy-draft",
    )

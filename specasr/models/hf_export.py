"""A distilled draft -> a Hugging Face `WhisperForCausalLM` directory.

The export is what `transformers`' assisted generation takes as `assistant_model`:
`WhisperForConditionalGeneration.generate(..., assistant_model=WhisperForCausalLM
.from_pretrained(OUT))`. The assistant reads the target's encoder outputs, as specasr's
draft does, so only the decoder is written:

- the target's token embeddings and positional table (the draft borrows them; the export
  must carry them);
- the draft's layers and final LayerNorm, with Hugging Face's key names (the draft file
  already uses them);
- `proj_out` [V, d], untied: the target's embedding rows for the draft's vocabulary, and
  for every other token a row whose score is a large negative constant for any input.

Why the constant works: the head reads LN(h) = g ⊙ n + b, where n = (h − mean) / std has
sum(n) = 0. A row w = c / g (elementwise) gives w · LN(h) = c·sum(n) + c·sum(b / g)
= c·sum(b / g), whatever h is. With c = −OFF_VOCAB / sum(b / g) every off-vocabulary token
scores −OFF_VOCAB (−1e4 ± float32 rounding), so softmax gives it exactly 0 and the greedy
proposal is the draft's. `WhisperForCausalLM` has no head bias, hence the construction. A
LayerNorm with a zero gain or sum(b / g) ≈ 0 cannot express it; the export then keeps the
target's rows there (the assistant may propose any token: still exact after verification,
with a different α) and says so.

A draft that attends over pooled frames (`DistilledDraft.cross_pool` > 1) has no
`WhisperForCausalLM` form: the assistant reads the target's encoder outputs as they are, every
frame. The export is then that draft's layers attending over every frame, and says so
(`ExportReport.cross_pool`, the config's `specasr_draft`): still exact after verification,
with its own α (docs/distill.md measures it).

Nothing here imports transformers: the config is written as JSON with Hugging Face's keys.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from specasr.models.convert import whisper_config

OFF_VOCAB = 1.0e4  # off-vocabulary tokens score −OFF_VOCAB
MIN_SUM = 1e-2  # |sum(b / g)| below this cannot place the constant reliably


@dataclass(frozen=True)
class ExportReport:
    out: Path
    layers: int
    vocab: int  # rows the draft can propose
    masked: bool  # off-vocabulary rows score −OFF_VOCAB (False: the target's rows, see above)
    cross_pool: int = 1  # the draft's pooling; the export attends over every frame (see above)


def off_vocab_row(gain: torch.Tensor, bias: torch.Tensor, score: float = -OFF_VOCAB) -> torch.Tensor | None:
    """gain, bias [d] of the final LayerNorm -> a head row [d] scoring `score` for every
    input, or None when this LayerNorm cannot express one (zero gain, sum(b / g) ≈ 0)."""
    g, b = gain.detach().double(), bias.detach().double()
    if bool((g == 0).any()):
        return None
    s = float((b / g).sum())
    if abs(s) < MIN_SUM:
        return None
    return ((score / s) / g).float()


def export_hf(draft_file: str | Path, target: str | None, out_dir: str | Path) -> ExportReport:
    """Writes OUT/config.json and OUT/model.safetensors (fp32), atomically (a temporary
    directory renamed into place). target: the target spec (default: the draft's metadata)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from specasr.models.draft import FORMAT
    from specasr.models.loading import _load_spec

    draft_file, out = Path(draft_file), Path(out_dir)
    if out.exists() and any(out.iterdir()):  # before the target is loaded
        raise FileExistsError(f"{out} exists and is not empty")
    with safe_open(str(draft_file), "pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != FORMAT:
            raise ValueError(f"{draft_file} is not a specasr draft file")
        own = {k: f.get_tensor(k).float() for k in f.keys()}  # noqa: SIM118 (no iterator)
    target = target or meta.get("target")
    if not target:
        raise ValueError(f"{draft_file} does not name its target; pass one")
    model, tok = _load_spec(target, torch.float32, torch.device("cpu"), pack=False)
    cfg = model.config
    if (cfg.d_model, cfg.vocab_size) != (int(meta["d_model"]), int(meta["vocab_size"])):
        raise ValueError(
            f"{draft_file} was made for d_model={meta['d_model']}, vocab={meta['vocab_size']}; "
            f"{target} has d_model={cfg.d_model}, vocab={cfg.vocab_size}"
        )
    dec = model.model.decoder
    embed = dec.embed_tokens.weight.detach().float()  # [V, d]
    vocab_ids = own.pop("vocab_ids").long()  # [N]
    row = off_vocab_row(own["layer_norm.weight"], own["layer_norm.bias"])
    head = embed.clone()  # [V, d]
    if row is not None:
        keep = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        keep[vocab_ids] = True
        head[~keep] = row
    tensors = {f"model.decoder.{k}": v.contiguous() for k, v in own.items()}
    tensors["model.decoder.embed_tokens.weight"] = embed.contiguous()
    tensors["model.decoder.embed_positions.weight"] = dec.embed_positions.weight.detach().float().contiguous()
    tensors["proj_out.weight"] = head.contiguous()
    pool = int(meta.get("cross_pool", 1))  # the draft's; the export attends over every frame
    config = whisper_config(
        tok,
        d_model=cfg.d_model,
        encoder_layers=cfg.encoder_layers,
        decoder_layers=int(meta["layers"]),
        encoder_heads=cfg.encoder_attention_heads,
        decoder_heads=int(meta["heads"]),
        ffn_dim=int(meta["ffn"]),
        n_mels=cfg.num_mel_bins,
        vocab_size=cfg.vocab_size,
        max_source_positions=cfg.max_source_positions,
        max_target_positions=cfg.max_target_positions,
    )
    config.update(
        architectures=["WhisperForCausalLM"],
        tie_word_embeddings=False,
        is_encoder_decoder=False,
        specasr_draft={
            "file": draft_file.name,
            "target": target,
            "vocab": len(vocab_ids),
            "masked": row is not None,
            "cross_pool": pool,
        },
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.mkdir(exist_ok=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    if out.exists():
        out.rmdir()
    tmp.replace(out)
    return ExportReport(out, int(meta["layers"]), len(vocab_ids), row is not None, pool)

"""Distil a fast draft for any Whisper target (`specasr distill train`).

Three resumable stages, each cached in a work directory:

1. **label**: every audio file is cut into 30 s windows; the target encodes each window
   (states cached, fp16) and labels it with its own greedy transcript, half the windows
   with timestamps. Windows whose transcript reaches `max_new_tokens` (a loop) are dropped.
2. **teacher**: the draft's vocabulary is chosen (the most frequent label tokens, filled
   up with the lowest BPE ids, plus <|endoftext|> and every timestamp token; tokens the
   target always suppresses are left out). Then the target is run teacher-forced over every
   label, with Whisper's logit filters applied exactly as when decoding, and its top-k
   next-token probabilities over that vocabulary are kept. A share of the sequences is
   prefixed with another window's text as a <|startofprev|> prompt, as long-form decoding
   does.
3. **train**: a 1–2 layer draft, initialised from target layers (`specasr.models.draft`), learns
   those distributions (cross-entropy on soft targets = KL up to a constant), with AdamW
   and a cosine schedule; checkpointed every `checkpoint_every` steps and resumable. The
   held-out windows report greedy agreement: how often the draft's argmax equals the
   target's token, which is what α is at T = 0.

The result is a `.safetensors` draft file holding only the draft's own weights.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from specasr.models.draft import POOLS, DistilledDraft, load_draft

AUDIO_SUFFIXES = {".wav", ".flac", ".mp3", ".ogg", ".m4a", ".opus", ".sph", ".webm"}
WINDOW = 16000 * 30


@dataclass(frozen=True)
class DistillOptions:
    layers: tuple[int, ...] = (0, -1)  # target decoder layers the draft starts from (-1 = last)
    vocab: int = 16384  # draft output vocabulary (0 = the full vocabulary)
    epochs: int = 6
    batch_size: int = 16
    lr: float = 5e-4
    weight_decay: float = 0.01
    warmup: int = 40  # linear warm-up steps, then cosine decay to 0
    top_k: int = 32  # teacher probabilities kept per position
    max_new_tokens: int = 200  # labels reaching this are loops and are dropped
    timestamps_share: float = 0.5  # windows labelled with timestamps
    prompt_share: float = 0.3  # sequences given a <|startofprev|> prompt
    holdout: float = 0.05  # windows kept out of training for the agreement score
    language: str | None = "en"  # None: detect per window; a corpus.jsonl naming languages wins
    init: str | None = None  # a draft file (or packaged:NAME) to start from instead of target layers
    cross_pool: int = 1  # frames per cross-attention K/V row it attends over (`DistilledDraft.pool_cross`)
    label_batch: int = 8
    checkpoint_every: int = 50
    seed: int = 0
    max_windows: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= len(self.layers) <= 4:
            raise ValueError("a draft has 1 to 4 layers")
        if self.vocab < 0 or 0 < self.vocab < 2048:
            raise ValueError("vocab must be 0 (full) or >= 2048")
        if self.cross_pool not in POOLS:
            raise ValueError("cross_pool must divide Whisper's 1500 frames: 1 to 6")


# ---- stage 1: windows, encoder states and greedy labels ---------------------------------
def audio_files(root: str | Path) -> list[Path]:
    root = Path(root)
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file())
    if not files:
        raise FileNotFoundError(f"no audio files ({', '.join(sorted(AUDIO_SUFFIXES))}) under {root}")
    return files


def _windows(files: list[Path], limit: int | None, languages: dict[Path, str] | None = None):
    """Yields (name, samples ≤ 30 s, language or None) per window; unreadable files are
    reported and skipped. languages: a file's language, where its corpus names one."""
    from specasr.audio import AudioError, load_audio

    n = 0
    for f in files:
        try:
            audio = load_audio(f)
        except AudioError as e:
            tqdm.write(f"skipping {f}: {e}")
            continue
        for i in range(0, max(len(audio), 1), WINDOW):
            piece = audio[i : i + WINDOW]
            if len(piece) >= 16000:
                yield f"{f.name}@{i // 16000}", piece, (languages or {}).get(f)
                n += 1
                if limit is not None and n >= limit:
                    return


def _batches(items, size: int):
    """Consecutive lists of `size` items (the last may be shorter), lazily: the audio of a
    large directory is never all in memory at once."""
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


@torch.inference_mode()
def label(
    pair, files: list[Path], work: Path, opts: DistillOptions, languages: dict[Path, str] | None = None
) -> list[Path]:
    """Stage 1; writes work/labels/NNNNN.pt shards {names, states [b,1500,d] fp16, tokens,
    languages, timestamps}. A window's language is `languages[file]` when given (a
    multilingual corpus says what each window speaks), else opts.language, else detected."""
    from specasr.decode.loop import decode_states
    from specasr.features import log_mel_window, pad_or_trim
    from specasr.options import DecodeOptions

    out = work / "labels"
    out.mkdir(parents=True, exist_ok=True)
    done = sorted(out.glob("*.pt"))
    if done:  # before any shard is written: a resumed directory keeps one target's labels
        check_shards([torch.load(done[0], mmap=True)], pair.compute_type)
    rng = random.Random(opts.seed)
    shards, dropped = [], 0
    for i, batch in enumerate(
        tqdm(
            _batches(_windows(files, opts.max_windows, languages), opts.label_batch),
            desc="label",
            unit="batch",
        )
    ):
        ts = rng.random() < opts.timestamps_share  # drawn for every batch, so resumes see the same flags
        shard = out / f"{i:05d}.pt"
        shards.append(shard)
        if shard.is_file():
            continue
        audio = torch.stack([pad_or_trim(torch.as_tensor(a)) for _, a, _ in batch])  # [b, 480000]
        mel = log_mel_window(audio, pair.n_mels)
        states, _ = pair.encode(mel)
        langs = [lang or opts.language for _, _, lang in batch]
        results = [None] * len(batch)
        for lang in dict.fromkeys(langs):  # rows of one language decode together
            rows = [r for r, x in enumerate(langs) if x == lang]
            dec = DecodeOptions(
                mode="autoregressive", timestamps=ts, language=lang, max_new_tokens=opts.max_new_tokens
            )
            if lang is None:  # one row at a time: rows may detect different languages
                outs = [res for r in rows for res in decode_states(pair, states[r : r + 1], None, dec)]
            else:
                outs = decode_states(pair, states[rows], None, dec)
            for r, res in zip(rows, outs):
                results[r] = res
        keep = [r for r, res in enumerate(results) if 0 < len(res.tokens) < opts.max_new_tokens - 1]
        dropped += len(batch) - len(keep)
        record = {
            "names": [batch[r][0] for r in keep],
            "states": states[keep].to(torch.float16).cpu(),
            "tokens": [results[r].tokens for r in keep],
            "languages": [results[r].language for r in keep],
            "timestamps": ts,
            "compute_type": pair.compute_type,  # whose states and tokens (`check_shards`)
        }
        tmp = shard.with_suffix(".tmp")
        torch.save(record, tmp)
        tmp.replace(shard)
    if dropped:
        tqdm.write(f"dropped {dropped} windows whose transcript looped to {opts.max_new_tokens} tokens")
    return shards


def check_shards(records: list[dict], compute_type: str) -> None:
    """Label shards hold one target's encoder states and greedy tokens: a work directory
    labelled at another compute type (`distill train --compute-type`) is refused before
    `label` writes into it, so it is never mixed. Shards from before the field were float32."""
    found = {r.get("compute_type", "float32") for r in records}
    if found - {compute_type}:
        raise RuntimeError(
            f"the work directory's labels are from a {', '.join(sorted(found))} target, not "
            f"{compute_type}: use another --work directory"
        )


# ---- stage 2: vocabulary and teacher distributions --------------------------------------
def choose_vocabulary(
    pair, token_lists: list[list[int]], size: int, prefer: torch.Tensor | None = None
) -> torch.Tensor:
    """Sorted ids: eot + timestamps + the most frequent label tokens + `prefer` (e.g. the
    vocabulary of the draft training starts from, lowest ids first) + the lowest BPE ids."""
    tok, V = pair.tokenizer, pair.vocab_size
    if size == 0:
        return torch.arange(V)
    suppressed = set(pair.suppress_tokens)
    always = {tok.eot} | set(range(tok.timestamp_begin, V)) if tok.timestamp_begin is not None else {tok.eot}
    chosen = set(always)
    counts = Counter(t for toks in token_lists for t in toks if t < tok.eot and t not in suppressed)
    for t, _ in counts.most_common():
        if len(chosen) >= size:
            break
        chosen.add(t)
    for t in sorted(prefer.tolist()) if prefer is not None else ():
        if len(chosen) >= size:
            break
        if t < tok.eot and t not in suppressed:
            chosen.add(t)
    t = 0
    while len(chosen) < size and t < tok.eot:
        if t not in suppressed:
            chosen.add(t)
        t += 1
    return torch.tensor(sorted(chosen))


def _init_file(init: str) -> Path:
    """The draft file `--init` names (a path or packaged:NAME)."""
    from specasr.models.loading import draft_path

    path = draft_path(init)
    if path is None:
        raise FileNotFoundError(f"--init {init!r} is not a specasr draft file")
    return path


def _init_vocabulary(init: str | None) -> torch.Tensor | None:
    """The vocabulary of the draft file `init` names (what it learned to propose), or None."""
    if not init:
        return None
    from safetensors import safe_open

    with safe_open(str(_init_file(init)), "pt") as f:
        return f.get_tensor("vocab_ids").long()


def coverage_by_language(records: list[dict], vocab: set[int]) -> dict[str, float]:
    """Label language -> share of its label tokens the draft vocabulary holds (every
    uncovered token is a rejection)."""
    hit, seen = Counter(), Counter()
    for rec in records:
        for lang, toks in zip(rec["languages"], rec["tokens"]):
            hit[lang] += sum(t in vocab for t in toks)
            seen[lang] += len(toks)
    return {lang: hit[lang] / seen[lang] for lang in sorted(seen, key=str) if seen[lang]}


@dataclass
class Example:
    state: int  # row of the state table
    seq: list[int]  # full decoder input: [prompt] + start sequence + label + eot
    begin: int  # index of the first label token in seq
    top_idx: torch.Tensor  # [n, k] int32: draft-vocabulary indices of the teacher's top k
    top_p: torch.Tensor  # [n, k] fp16: their teacher probabilities, renormalised
    label: torch.Tensor  # [n] int64: the label tokens as draft-vocabulary indices (-1 = outside)


@torch.inference_mode()
def teacher(pair, records: list[dict], vocab_ids: torch.Tensor, opts: DistillOptions):
    """Stage 2: label shards (as `label` wrote them) -> (states [n,1500,d] fp16, examples).
    One batched teacher-forced pass per shard."""
    from specasr.decode.filters import apply_filters
    from specasr.decode.task import start_sequence, task_filters
    from specasr.options import DecodeOptions

    tok = pair.tokenizer
    lookup = torch.full((pair.vocab_size,), -1, dtype=torch.long)
    lookup[vocab_ids] = torch.arange(len(vocab_ids))
    cols = vocab_ids.to(pair.device)
    rng = random.Random(opts.seed + 1)
    states, examples = [], []
    all_tokens = [t for r in records for t in r["tokens"]]
    for rec in tqdm(records, desc="teacher", unit="shard"):
        ts, seqs, begins = rec["timestamps"], [], []
        for j, label_tokens in enumerate(rec["tokens"]):
            prompt = None
            if rng.random() < opts.prompt_share:
                other = [t for t in rng.choice(all_tokens) if t < tok.eot]
                prompt = other[-rng.randint(8, 120) :] or None
            lang = rec["languages"][j]
            dec = DecodeOptions(mode="autoregressive", timestamps=ts, language=lang)
            init, _ = start_sequence(pair, dec, lang, prompt)
            seqs.append(init + label_tokens + [tok.eot])
            begins.append(len(init))
        if not seqs:
            continue
        T = max(map(len, seqs)) - 1
        ids = torch.tensor(
            [q[:-1] + [tok.eot] * (T - len(q) + 1) for q in seqs], device=pair.device
        )  # [b, T]
        st = rec["states"].to(device=pair.device, dtype=pair.dtype)
        hidden = pair.target.model.decoder(ids, st)  # [b, T, d]; right padding never reaches back
        for j, (seq, begin) in enumerate(zip(seqs, begins)):
            logits = pair.target.proj_out(hidden[j, begin - 1 : len(seq) - 1]).float()  # [n, V]
            filters = task_filters(pair, DecodeOptions(mode="autoregressive", timestamps=ts), begin)
            apply_filters(filters, logits, [seq[:i] for i in range(begin, len(seq))])
            p = torch.softmax(logits, -1)[:, cols].cpu()  # [n, N]
            top_p, top_idx = p.topk(min(opts.top_k, p.shape[1]), dim=-1)
            top_p = top_p / top_p.sum(-1, keepdim=True).clamp(min=1e-12)
            examples.append(
                Example(
                    len(states),
                    seq,
                    begin,
                    top_idx.to(torch.int32),
                    top_p.to(torch.float16),
                    lookup[torch.tensor(seq[begin:])],
                )
            )
            states.append(rec["states"][j])
    return torch.stack(states), examples


# ---- stage 3: training --------------------------------------------------------------------
def _loss(draft: DistilledDraft, examples: list[Example], cross, device) -> tuple[torch.Tensor, int, int]:
    """Soft cross-entropy summed over label positions; also (greedy agreements, positions).
    cross: per layer (K, V) [n, H, S, dh] fp16 for every example's window."""
    T = max(len(e.seq) - 1 for e in examples)
    tokens = torch.zeros(len(examples), T, dtype=torch.long)
    for r, e in enumerate(examples):
        tokens[r, : len(e.seq) - 1] = torch.tensor(e.seq[:-1])
    rows_idx = torch.tensor([e.state for e in examples])
    kv = [(k[rows_idx].to(device).float(), v[rows_idx].to(device).float()) for k, v in cross]
    logq = F.log_softmax(draft(tokens.to(device), kv).float(), dim=-1)  # [B, T, N]
    total, agree, n = 0.0, 0, 0
    for r, e in enumerate(examples):
        rows = logq[r, e.begin - 1 : len(e.seq) - 1]  # [n, N]: predicting seq[begin:]
        idx, p = e.top_idx.to(device).long(), e.top_p.to(device).float()
        total = total - (p * rows.gather(1, idx)).sum()
        agree += int((rows.argmax(-1).cpu() == e.label).sum())
        n += rows.shape[0]
    return total, agree, n


@torch.no_grad()
def precompute_cross(draft: DistilledDraft, states: torch.Tensor, device, batch: int = 16):
    """The draft's cross-attention K/V for every window (its K/V projections stay frozen):
    per layer K, V [n, H, S, dh] fp16, filled in place. Collecting batches and concatenating
    them would hold every K/V twice at the peak: 4 × the states' size per layer, enough to
    run a corpus of a few thousand windows out of memory."""
    n, S = states.shape[:2]
    shape = (n, draft.heads, S, draft.d_model // draft.heads)
    out = [
        (torch.empty(shape, dtype=torch.float16), torch.empty(shape, dtype=torch.float16))
        for _ in draft.layers
    ]
    for i in tqdm(range(0, n, batch), desc="cross K/V", unit="batch"):
        kv = draft.cross_kv(states[i : i + batch].to(device).float())
        for (K, V), (k, v) in zip(out, kv):
            K[i : i + batch] = k.to(torch.float16).cpu()
            V[i : i + batch] = v.to(torch.float16).cpu()
    return out


def evaluate(draft: DistilledDraft, examples: list[Example], cross, device, batch: int) -> dict:
    draft.eval()
    loss, agree, n = 0.0, 0, 0
    with torch.no_grad():
        for i in range(0, len(examples), batch):
            lo, a, k = _loss(draft, examples[i : i + batch], cross, device)
            loss, agree, n = loss + float(lo), agree + a, n + k
    draft.train()
    return {"loss": loss / max(n, 1), "agreement": agree / max(n, 1), "positions": n}


def split_examples(examples: list[Example], opts: DistillOptions) -> tuple[list[Example], list[Example]]:
    """(held out, training): a shuffle seeded by opts.seed, the first `holdout` share held
    out. `stop_sweep --held-out` uses the same split to choose γ and the stop on windows
    the draft never trained on."""
    order = list(range(len(examples)))
    random.Random(opts.seed).shuffle(order)
    n_hold = max(1, int(len(order) * opts.holdout))
    return [examples[i] for i in order[:n_hold]], [examples[i] for i in order[n_hold:]]


def _save_checkpoint(path: Path, **state) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def train(pair, states, examples: list[Example], vocab_ids, work: Path, opts: DistillOptions, log=print):
    """Stage 3 -> the trained draft (also resumes from work/checkpoint.pt)."""
    torch.manual_seed(opts.seed)
    n_layers = pair.target.config.decoder_layers
    layers = tuple(i % n_layers for i in opts.layers)
    if opts.init:  # continue from a trained draft's layers, over this run's vocabulary
        draft = load_draft(_init_file(opts.init), pair.target, torch.float32, pair.device)
        draft.requires_grad_(True)
        draft.vocab_ids = vocab_ids.long().to(pair.device)
        draft.meta = {"init_layers": draft.meta["init_layers"]}
    else:
        draft = DistilledDraft.from_target(pair.target, layers, vocab_ids).float().to(pair.device)
    draft.cross_pool = opts.cross_pool  # the run's, also over an init draft's own
    target_f32 = pair.target if pair.dtype == torch.float32 else None
    draft.attach(target_f32 or pair.target)  # shared tensors stay frozen (the target needs no grad)
    if target_f32 is None:  # train in fp32 against fp32 copies of the shared tensors
        draft._shared = {k: v.float() for k, v in draft._shared.items()}
    for layer in draft.layers:  # cross-attention K/V stay the target's: computed once per window
        layer.encoder_attn.k_proj.requires_grad_(False)
        layer.encoder_attn.v_proj.requires_grad_(False)
    cross = precompute_cross(draft, states, pair.device)
    held, train_set = split_examples(examples, opts)
    steps_per_epoch = math.ceil(len(train_set) / opts.batch_size)
    total = steps_per_epoch * opts.epochs
    optim = torch.optim.AdamW(
        [p for p in draft.parameters() if p.requires_grad], lr=opts.lr, weight_decay=opts.weight_decay
    )

    def lr_at(step: int) -> float:
        if step < opts.warmup:
            return (step + 1) / opts.warmup
        return 0.5 * (1 + math.cos(math.pi * (step - opts.warmup) / max(1, total - opts.warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(optim, lr_at)
    ckpt = work / "checkpoint.pt"
    step, history = 0, []
    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=False)
        draft.load_state_dict(state["draft"])
        optim.load_state_dict(state["optim"])
        sched.load_state_dict(state["sched"])
        step, history = state["step"], state["history"]
        log(f"resumed from step {step}")
    if step == 0:
        history.append({"step": 0, **evaluate(draft, held, cross, pair.device, opts.batch_size)})
        log(f"step 0 (initialisation): held-out {history[-1]}")
    draft.train()
    bar = tqdm(total=total, initial=step, desc="train", unit="step")
    while step < total:
        epoch, k = divmod(step, steps_per_epoch)
        perm = list(range(len(train_set)))
        random.Random(opts.seed * 1000 + epoch).shuffle(perm)
        batch = [train_set[i] for i in perm[k * opts.batch_size : (k + 1) * opts.batch_size]]
        loss, agree, n = _loss(draft, batch, cross, pair.device)
        optim.zero_grad(set_to_none=True)
        (loss / n).backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optim.step()
        sched.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item() / n:.3f}", agree=f"{agree / n:.3f}")
        end_of_epoch = step % steps_per_epoch == 0
        if step % opts.checkpoint_every == 0 or end_of_epoch or step == total:
            if end_of_epoch or step == total:
                history.append({"step": step, **evaluate(draft, held, cross, pair.device, opts.batch_size)})
                tqdm.write(f"step {step}: held-out {history[-1]}")
            _save_checkpoint(
                ckpt,
                draft=draft.state_dict(),
                optim=optim.state_dict(),
                sched=sched.state_dict(),
                step=step,
                history=history,
            )
    bar.close()
    draft.meta["history"] = json.dumps(history[-1])
    return draft.eval(), history


def distill(
    pair,
    audio_dir,
    out: str | Path,
    work: str | Path,
    opts: DistillOptions,
    log=print,
    stop_after: str = "train",
) -> dict:
    """The three stages (cached in `work`, resumable); writes the draft to `out` (fp16) and
    returns a summary. stop_after: "label" | "teacher" | "train"."""
    if opts.vocab:
        opts = replace(opts, vocab=min(opts.vocab, pair.vocab_size))
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    (work / "options.json").write_text(json.dumps(asdict(opts), indent=1))
    from specasr.recipes.speech_corpus import window_languages

    files = audio_files(audio_dir)
    named = {Path(audio_dir) / rel: lang for rel, lang in window_languages(audio_dir).items()}
    if named:
        log(f"window languages from the corpus: {dict(Counter(named[f] for f in files if f in named))}")
    shards = label(pair, files, work, opts, named)
    if stop_after == "label":
        return {"shards": len(shards)}
    records = [torch.load(s) for s in shards]  # loaded once: they hold the encoder states
    token_lists = [t for r in records for t in r["tokens"]]
    label_langs = Counter(x for r in records for x in r["languages"] if x)
    if not token_lists:
        raise RuntimeError("no usable windows: every window was unreadable or looped")
    vocab_ids = choose_vocabulary(pair, token_lists, opts.vocab, _init_vocabulary(opts.init))
    vocab_set = set(vocab_ids.tolist())
    covered = sum(t in vocab_set for toks in token_lists for t in toks)
    coverage = covered / max(1, sum(map(len, token_lists)))
    by_lang = coverage_by_language(records, vocab_set)
    log(
        f"{len(token_lists)} windows, {sum(map(len, token_lists))} label tokens; "
        f"draft vocabulary {len(vocab_ids)} covers {coverage:.2%} of them"
        + (
            "; by language " + ", ".join(f"{k} {v:.1%}" for k, v in by_lang.items())
            if len(by_lang) > 1
            else ""
        )
    )
    key = {
        "shards": len(shards),
        "vocab": vocab_ids.tolist(),
        "prompt_share": opts.prompt_share,
        "top_k": opts.top_k,
        "seed": opts.seed,
    }
    cache = work / "teacher.pt"
    cached = torch.load(cache, weights_only=False) if cache.is_file() else None
    if cached is not None and cached["key"] == key:
        states, examples = cached["states"], cached["examples"]
    else:
        states, examples = teacher(pair, records, vocab_ids, opts)
        _save_checkpoint(cache, key=key, states=states, examples=examples)
    del records
    if stop_after == "teacher":
        return {"examples": len(examples)}
    draft, history = train(pair, states, examples, vocab_ids, work, opts, log)
    recipe = {k: v for k, v in asdict(opts).items() if k not in ("checkpoint_every",)}
    if label_langs:  # what the labels speak: the loop's backoff starts target-only on the rest
        recipe["language"] = ",".join(sorted(label_langs))
    recipe["compute_type"] = pair.compute_type  # the target whose states and tokens it learnt
    draft.save(out, target=pair.target_name, recipe=json.dumps(recipe))
    summary = {
        "windows": len(token_lists),
        "coverage": coverage,
        "coverage_by_language": by_lang,
        "vocab": len(vocab_ids),
        "history": history,
    }
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


# ---- averaging two drafts ------------------------------------------------------------------
def average_drafts(
    base: str, other: str, weight: float, out: str | Path, cross_pool: int | None = None
) -> dict:
    """Writes (1 − weight) · base + weight · other, tensor by tensor (a "model soup" of two
    drafts trained from one another: same layers and shapes), with base's vocabulary and
    metadata. A run that moved a draft towards new data (other) can lose speech the base knew
    (docs/distill.md); a point between them can keep most of both. cross_pool: the
    average's (default: base's, which must then equal other's). base, other: files or
    packaged:NAME. Returns the metadata written."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    def read(spec: str) -> tuple[dict, dict]:
        with safe_open(str(_init_file(spec)), "pt") as f:
            return f.metadata() or {}, {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118

    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight {weight} is not in [0, 1]")
    if cross_pool is not None and cross_pool not in POOLS:
        raise ValueError(f"cross_pool must divide Whisper's 1500 frames: 1 to 6, not {cross_pool}")
    (meta_a, a), (meta_b, b) = read(base), read(other)
    own = [k for k in a if k != "vocab_ids"]
    if sorted(own) != sorted(k for k in b if k != "vocab_ids") or any(a[k].shape != b[k].shape for k in own):
        raise ValueError(f"{base} and {other} do not hold the same tensors")
    pools = [int(m.get("cross_pool", 1)) for m in (meta_a, meta_b)]
    if cross_pool is None and pools[0] != pools[1]:
        raise ValueError(f"{base} pools {pools[0]} frames, {other} {pools[1]}: say which the average pools")
    tensors = {k: ((1 - weight) * a[k].float() + weight * b[k].float()).to(a[k].dtype) for k in own}
    tensors["vocab_ids"] = a["vocab_ids"]
    meta = {k: v for k, v in meta_a.items() if k != "cross_pool"}
    pool = pools[0] if cross_pool is None else cross_pool
    if pool > 1:
        meta["cross_pool"] = str(pool)
    meta["average"] = json.dumps({"base": base, "other": other, "weight": weight})
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(out)
    return meta

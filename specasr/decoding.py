"""Decoding one 30 s window: target-only (autoregressive) or speculative.

The speculative step, per verify pass (Leviathan et al.; the γ policy lives in gamma.py):

1. the draft proposes d1 … dγ from its own KV cache (argmax, or a sample from
   q = softmax(filtered draft logits / T));
2. the target runs once on [last token, d1 … dγ] and yields γ+1 logit rows;
3. both are filtered per position i with context prefix + d1 … di (filters.py);
4. `specasr.kernels.verify` accepts n of the drafts and gives one more token;
5. both KV caches are cropped back to the accepted prefix: the caches are indexed by
   position, so rolling back recomputes nothing.

Rows of a batch advance in lockstep by m + 1 tokens, m = min over rows of the accepted
count: a row that accepted more keeps its accepted draft token at position m + 1 instead of
the verifier's extra token. Any prefix of a speculative sample is distributed as the
target's, so this is exact in distribution, and at T = 0 it is the greedy sequence. The
faster rows' surplus acceptances are the price of a rectangular KV cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from specasr import kernels
from specasr.filters import LogitFilter, apply_filters, build_filters
from specasr.gamma import make_policy
from specasr.kernels.exact import first_argmax
from specasr.lean_decoder import N_TEXT_CTX, LeanDecoder, LeanRunner, lean_decoder
from specasr.options import DecodeOptions
from specasr.stats import DecodeStats, timed


@dataclass
class DecodeResult:
    tokens: list[int]  # sampled tokens, without the start sequence and <|endoftext|>
    text: str  # decoded text of `tokens` (timestamps dropped)
    avg_logprob: float  # sum of target log-probs of the sampled tokens (and eot) / (len + 1)
    no_speech_prob: float  # target P(<|nospeech|>) at the <|startoftranscript|> position
    temperature: float
    language: str | None
    stats: DecodeStats = field(repr=False)  # shared by every row of one batch

    @property
    def encoder_s(self) -> float:
        return self.stats.encoder_s

    @property
    def decoder_s(self) -> float:
        return self.stats.decoder_s


class DecoderRunner:
    """One Whisper decoder (Hugging Face modules) and its KV cache, for CUDA and non-fp32
    models; on CPU in fp32 `make_runner` picks `LeanRunner`. The cache holds the first
    `length` positions of every row; rows are kept at equal length."""

    def __init__(self, model, encoder_states: Tensor) -> None:
        self.model = model
        self.states = encoder_states  # [B, 1500, d_model]
        self.cache = None
        self.length = 0

    @torch.inference_mode()
    def __call__(self, tokens: Tensor, last: int) -> Tensor:
        """tokens: [B, k] at positions length … length+k-1 -> logits [B, last, V] of the final rows."""
        out = self.model.model.decoder(
            input_ids=tokens,
            encoder_hidden_states=self.states,
            past_key_values=self.cache,
            use_cache=True,
        )
        self.cache = out.past_key_values
        self.length += tokens.shape[1]
        return self.model.proj_out(out.last_hidden_state[:, -last:])

    def rollback(self, length: int) -> None:
        if length < self.length:
            self.cache.crop(length - self.length)  # negative: drop that many trailing positions
            self.length = length

    def keep(self, rows: Tensor) -> None:
        """Keep only these batch rows (finished rows stop consuming work)."""
        self.cache.batch_select_indices(rows)
        self.states = self.states[rows]

    def cache_prefix(self) -> list[Tensor]:
        """Per layer the self-attention K and V [B, H, length, dh] (for tests)."""
        return [t for layer in self.cache.self_attention_cache.layers for t in (layer.keys, layer.values)]


def make_runner(model, encoder_states: Tensor, target=None):
    """The decoder loop for a model: a distilled draft brings its own lean runner; a Whisper
    model in fp32 on CPU gets `LeanRunner` over its `LeanDecoder` view (same function, faster
    products); anything else gets `DecoderRunner` around the Hugging Face module. target: the
    target's runner, whose cross K/V a distilled draft on the same states may reuse."""
    if hasattr(model, "runner"):
        shared = target is not None and isinstance(target, LeanRunner) and target.states is encoder_states
        return model.runner(encoder_states, target.cross if shared else None)
    if LeanDecoder.supports(model):
        return LeanRunner(lean_decoder(model), encoder_states)
    return DecoderRunner(model, encoder_states)


def _pick(logits: Tensor, temperature: float, gen: torch.Generator) -> Tensor:
    """logits [N, V] -> tokens [N]: argmax at T = 0, else the exponential race
    argmax(softmax(l/T) / E), E ~ Exp(1), an exact sample from softmax(l/T)."""
    if temperature == 0:
        return first_argmax(logits)
    noise = torch.empty(logits.shape, device=logits.device, dtype=torch.float32).exponential_(generator=gen)
    noise.clamp_(min=torch.finfo(torch.float32).tiny)  # an Exp(1) draw of exactly 0 must not win
    return (logits.float() / temperature - noise.log()).argmax(dim=-1)


def _confidence(rows: Tensor, picked: Tensor, temperature: float) -> float:
    """The least, over the batch's rows, of the draft's probability of the token it picked:
    q(d) = softmax(rows / T)[d], with T = 1 for greedy drafts. rows [B, V] (filtered), picked [B].

    The draft-confidence stop ends a draft run on a proposal it is unsure of: the tokens
    after it would probably be rejected, so their draft steps and verify positions would
    be wasted. Exactness is untouched: when to stop depends only on the draft's own
    proposals, each proposal is still verified against the target's distribution, and
    every position the draft did not reach is drawn from the target itself."""
    scaled = rows.float() / temperature if temperature > 0 else rows.float()
    # softmax, not logsumexp: a draft row is −inf off its vocabulary (two thirds of base's),
    # where torch.logsumexp takes 280 µs a row on the dev box and softmax 50 µs
    return float(torch.softmax(scaled, -1).gather(1, picked[:, None]).min())


def start_sequence(
    pair, options: DecodeOptions, language: str | None, prompt: list[int] | None
) -> tuple[list[int], int]:
    """Initial decoder tokens and the index of <|startoftranscript|> in them."""
    tok = pair.tokenizer
    seq = tok.sot_sequence(language, options.task, options.timestamps)
    if not prompt:
        return seq, 0
    prev = [tok.sot_prev] + list(prompt)[-(N_TEXT_CTX // 2 - 1) :]
    return prev + seq, len(prev)


def task_filters(pair, options: DecodeOptions, sample_begin: int) -> list[LogitFilter]:
    """Whisper's logit filters for decoding with `options` after `sample_begin` prompt tokens."""
    return build_filters(
        pair.tokenizer,
        vocab_size=pair.vocab_size,
        sample_begin=sample_begin,
        suppress_tokens=pair.suppress_tokens if options.suppress_tokens else (),
        begin_suppress_tokens=pair.begin_suppress_tokens,
        suppress_blank=options.suppress_blank,
        timestamps=options.timestamps,
    )


@torch.inference_mode()
def detect_language(pair, target_states: Tensor) -> list[str]:
    """Most likely language per row, from the target's logits after <|startoftranscript|>."""
    tok = pair.tokenizer
    if not tok.multilingual:
        return ["en"] * target_states.shape[0]
    runner = make_runner(pair.target, target_states)
    sot = torch.full((target_states.shape[0], 1), tok.sot, device=target_states.device)
    logits = runner(sot, 1)[:, -1].float()  # [B, V]
    codes, ids = zip(*tok.language_tokens.items())
    best = logits[:, list(ids)].argmax(dim=-1).tolist()
    return [codes[i] for i in best]


@torch.inference_mode()
def decode(pair, mel: Tensor, options: DecodeOptions, prompt: list[int] | None = None) -> list[DecodeResult]:
    """mel: Tensor, shape = (B, n_mels, 3000) -> one DecodeResult per row."""
    stats = DecodeStats()
    with timed(stats, "encoder_s", pair.device):
        target_states, draft_states = pair.encode(mel)
    return decode_states(pair, target_states, draft_states, options, prompt, stats)


@torch.inference_mode()
def decode_states(
    pair,
    target_states: Tensor,
    draft_states: Tensor | None,
    options: DecodeOptions,
    prompt: list[int] | None = None,
    stats: DecodeStats | None = None,
) -> list[DecodeResult]:
    """Decodes from encoder outputs (reused across temperature fallbacks).

    target_states: (B, 1500, d_target); draft_states: (B, 1500, d_draft) or None.
    """
    stats = stats or DecodeStats()
    if options.speculative and (pair.draft is None or draft_states is None):
        raise ValueError(f"mode {options.mode!r} needs a draft model; load one or use mode 'autoregressive'")
    language = options.language
    if language is None:
        languages = detect_language(pair, target_states)
        if len(set(languages)) > 1:
            raise ValueError("rows of one batch detected different languages; decode them separately")
        language = languages[0]
    init, sot_index = start_sequence(pair, options, language, prompt)
    sample_begin = len(init)
    limit = (
        N_TEXT_CTX
        if options.max_new_tokens is None
        else min(N_TEXT_CTX, sample_begin + options.max_new_tokens)
    )
    if limit <= sample_begin:
        raise ValueError(f"the prompt leaves no room to decode ({sample_begin} of {N_TEXT_CTX} positions)")
    filters = task_filters(pair, options, sample_begin)
    loop = _Loop(pair, options, filters, stats, init, sot_index, limit)
    with timed(stats, "decoder_s", pair.device):
        loop.run(target_states, draft_states if options.speculative else None)
    results = []
    for r in range(len(target_states)):
        toks = loop.seqs[r][sample_begin:]
        text_toks = toks[:-1] if toks and toks[-1] == pair.tokenizer.eot else toks
        results.append(
            DecodeResult(
                tokens=text_toks,
                text=pair.tokenizer.decode(text_toks),
                avg_logprob=loop.sum_logprob[r] / (len(text_toks) + 1),
                no_speech_prob=loop.no_speech[r],
                temperature=options.temperature,
                language=language,
                stats=stats,
            )
        )
    return results


class _Loop:
    """State of one batched decode: contexts, finished rows, log-probs; runs either loop."""

    def __init__(
        self,
        pair,
        options: DecodeOptions,
        filters: list[LogitFilter],
        stats: DecodeStats,
        init: list[int],
        sot_index: int,
        limit: int,
    ) -> None:
        self.pair, self.opts, self.filters, self.stats = pair, options, filters, stats
        self.init, self.sot_index, self.limit = init, sot_index, limit
        self.eot = pair.tokenizer.eot
        self.device = pair.device
        self.gen = torch.Generator(device=pair.device).manual_seed(options.seed)
        self.seqs: list[list[int]] = []
        self.sum_logprob: list[float] = []
        self.no_speech: list[float] = []

    # ---- shared pieces ----------------------------------------------------------------
    def _tensor(self, rows: list[int], start: int, stop: int, extra: list[list[int]] | None = None) -> Tensor:
        """Tokens [len(rows), stop-start] of contexts (plus per-row proposals) at positions start … stop-1."""
        data = [(self.seqs[r] + (extra[j] if extra else []))[start:stop] for j, r in enumerate(rows)]
        return torch.tensor(data, dtype=torch.long, device=self.device)

    def _no_speech(self, logits: Tensor) -> list[float]:
        """logits [B, k, V] of a first pass whose rows start at the sot position."""
        probs = torch.softmax(logits[:, 0].float(), dim=-1)
        return probs[:, self.pair.tokenizer.no_speech].tolist()

    def _finish(self, active: list[int], runners: list[DecoderRunner]) -> list[int]:
        keep = [
            j for j, r in enumerate(active) if self.seqs[r][-1] != self.eot and len(self.seqs[r]) < self.limit
        ]
        if len(keep) < len(active) and keep:
            idx = torch.tensor(keep, device=self.device)
            for runner in runners:
                runner.keep(idx)
        return [active[j] for j in keep]

    def run(self, target_states: Tensor, draft_states: Tensor | None) -> None:
        B = target_states.shape[0]
        self.seqs = [list(self.init) for _ in range(B)]
        self.sum_logprob = [0.0] * B
        self.no_speech = [math.nan] * B
        with timed(self.stats, "window_s", self.device):
            target = make_runner(self.pair.target, target_states)
            draft = None if draft_states is None else make_runner(self.pair.draft, draft_states, target)
        opts = self.opts
        policy = make_policy(opts.gamma_policy, opts.gamma, opts.gamma_max, target_states.device.type)
        active = list(range(B))
        while active:
            L = len(self.seqs[active[0]])
            gamma = 0 if draft is None else max(0, min(policy.next(), self.limit - L - 1))
            if gamma == 0:
                self._autoregressive_step(active, target)
            else:
                used, m, draft_s, target_s = self._speculative_step(active, target, draft, gamma)
                policy.update(used, m, draft_s, target_s, stopped=used < gamma)
            active = self._finish(active, [target] + ([draft] if draft is not None else []))

    # ---- target only --------------------------------------------------------------------
    def _autoregressive_step(self, active: list[int], target: DecoderRunner) -> None:
        st = self.stats
        first = target.length == 0
        with timed(st, "target_s", self.device), timed(st, "window_s" if first else None, self.device):
            L = len(self.seqs[active[0]])
            last = L - (self.sot_index if first else target.length)  # first pass: from sot, skip the prompt
            logits = target(self._tensor(active, target.length, L), last)  # [B, last, V]
            if first:
                ns = self._no_speech(logits)
            rows = logits[:, -1].contiguous()  # [B, V]
            apply_filters(self.filters, rows, [self.seqs[r] for r in active])
        tok = _pick(rows, self.opts.temperature, self.gen)
        lp = (rows.float().gather(1, tok[:, None])[:, 0] - torch.logsumexp(rows.float(), -1)).tolist()
        for j, (r, t) in enumerate(zip(active, tok.tolist())):
            self.seqs[r].append(t)
            self.sum_logprob[r] += lp[j]
            if first:
                self.no_speech[r] = ns[j]
        target.rollback(L)  # the cache holds every token but the newest
        st.target_calls += 1
        st.emitted += len(active)
        st.row_steps += len(active)

    # ---- speculative --------------------------------------------------------------------
    def _speculative_step(
        self, active: list[int], target: DecoderRunner, draft: DecoderRunner, gamma: int
    ) -> tuple[int, int, float, float]:
        """One draft run and verify pass; returns (γ used, fewest accepted, draft s, target s).
        γ used is below `gamma` when the draft-confidence stop ended the run early."""
        st, opts, dev = self.stats, self.opts, self.device
        B, L = len(active), len(self.seqs[active[0]])
        props: list[list[int]] = [[] for _ in active]  # proposals d1 … dγ per row
        d_logits = []
        draft_before, target_before = st.draft_s, st.target_s
        with timed(st, "draft_s", dev):
            for i in range(gamma):
                feed = self._tensor(active, draft.length, L + i, props)
                rows = draft(feed, 1)[:, -1].contiguous()  # [B, V]
                apply_filters(self.filters, rows, [self.seqs[r] + props[j] for j, r in enumerate(active)])
                picked = _pick(rows, opts.temperature, self.gen)  # [B]
                tok = picked.tolist()
                for j in range(B):
                    props[j].append(tok[j])
                d_logits.append(rows)
                if (
                    opts.draft_stop > 0
                    and i + 1 < gamma
                    and _confidence(rows, picked, opts.temperature) < opts.draft_stop
                ):
                    gamma = i + 1
                    st.draft_stops += 1
                    break
        st.draft_calls += gamma
        first = target.length == 0
        with timed(st, "target_s", dev), timed(st, "window_s" if first else None, dev):
            feed = self._tensor(active, target.length, L + gamma, props)
            logits = target(feed, feed.shape[1] - self.sot_index if first else gamma + 1)  # [B, k, V]
            if first:
                ns = self._no_speech(logits)
            logits = logits[:, -(gamma + 1) :].contiguous()  # [B, γ+1, V]
            contexts = [self.seqs[r] + props[j][:i] for j, r in enumerate(active) for i in range(gamma + 1)]
            apply_filters(self.filters, logits.view(B * (gamma + 1), -1), contexts)
        st.target_calls += 1
        draft_tokens = torch.tensor(props, dtype=torch.long, device=dev)  # [B, γ]
        if opts.temperature > 0:
            uniforms, noise = kernels.make_randomness(B, gamma, logits.shape[-1], self.gen, dev)
        else:
            uniforms = torch.zeros((B, gamma), device=dev)
            noise = torch.ones((B, logits.shape[-1]), device=dev)
        verify_before = st.verify_s
        with timed(st, "verify_s", dev):
            n_acc, nxt = kernels.verify(
                logits,
                torch.stack(d_logits, dim=1),
                draft_tokens,
                uniforms,
                noise,
                temperature=opts.temperature,
                mode=opts.mode,
                sigmoid_scale=opts.sigmoid_scale,
                backend=opts.backend,
            )
        st.verify_times.append(st.verify_s - verify_before)
        n_acc, nxt = n_acc.tolist(), nxt.tolist()
        m = min(n_acc)
        # lockstep: every row emits d1 … dm plus one more token
        new = [props[j][:m] + [nxt[j] if n_acc[j] == m else props[j][m]] for j in range(B)]
        emitted = torch.tensor(new, dtype=torch.long, device=dev)  # [B, m+1]
        rows = logits[:, : m + 1].float()
        lps = (rows.gather(2, emitted[:, :, None])[..., 0] - torch.logsumexp(rows, -1)).tolist()
        for j, r in enumerate(active):
            toks = new[j]
            if self.eot in toks:
                toks = toks[: toks.index(self.eot) + 1]
            self.seqs[r] += toks
            self.sum_logprob[r] += sum(lps[j][: len(toks)])
            if first:
                self.no_speech[r] = ns[j]
            st.accepted += n_acc[j]
            st.rejected += n_acc[j] < gamma
            st.accepted_hist[n_acc[j]] += 1
            st.emitted += len(toks)
        st.proposed += gamma * B
        st.row_steps += B
        st.gammas.append(gamma)
        target.rollback(L + m)
        draft.rollback(min(draft.length, L + m))
        return gamma, m, st.draft_s - draft_before, st.target_s - target_before

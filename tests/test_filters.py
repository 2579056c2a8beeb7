"""Whisper's timestamp rules on crafted rows: the grammar, and forcing a timestamp when the
timestamps' total probability beats every single text token."""

from __future__ import annotations

import math

import torch
from tiny_pairs import random_tiny_pair

from specasr.decode.filters import TimestampRules, apply_filters, build_filters, on_vocab


def _rules():
    tok = random_tiny_pair(seed=0).tokenizer
    return tok, TimestampRules(tok, sample_begin=4, max_initial_timestamp=1.0)


def test_timestamps_are_forced_when_their_total_mass_wins():
    tok, rules = _rules()
    tb, V = tok.timestamp_begin, 51865
    ctx = [0, 1, 2, 3, 440, 2068]  # two text tokens sampled: any token may follow
    spread = torch.full((2, V), -30.0)
    spread[:, 440] = 0.0  # the best text token
    spread[0, tb : tb + 20] = -1.0  # 20 timestamps, each less likely than it, together likelier
    spread[1, tb : tb + 2] = -1.0  # 2 of them: together still less likely
    rules.apply(spread, [ctx, ctx])
    assert torch.isinf(spread[0, :tb]).all() and spread[0, tb] == -1.0  # row 0: text suppressed
    assert spread[1, 440] == 0.0  # row 1: untouched text


def test_forcing_matches_whispers_log_softmax_formulation():
    """log Σ_ts p > max_text log p, computed on logits, agrees with the log-probability form."""
    tok, rules = _rules()
    tb = tok.timestamp_begin
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 51865, generator=g) * 3
    logits[:, tb:] += torch.linspace(-6, 6, 64)[:, None]  # from clearly text to clearly timestamps
    logprobs = torch.log_softmax(logits, dim=-1)
    expected = torch.logsumexp(logprobs[:, tb:], -1) > logprobs[:, :tb].amax(-1)
    ctx = [0, 1, 2, 3, 440, 2068]
    out = logits.clone()
    rules.apply(out, [ctx] * 64)
    forced = torch.isinf(out[:, :tb]).all(dim=-1)
    assert torch.equal(forced, expected) and 0 < int(forced.sum()) < 64


def test_forcing_decides_rows_inside_the_band_by_the_full_sum():
    """The rule reads two maxima and sums the timestamps only for a row whose text maximum lies
    in [max_ts, max_ts + log n_ts]; rows just inside that band on either side of the decision,
    at its edges, and with every timestamp suppressed decide as the full logsumexp does."""
    tok, rules = _rules()
    tb, V = tok.timestamp_begin, 51865
    n = V - tb  # timestamps: equal logits L sum to L + log n
    levels = [-math.log(n) + d for d in (-1e-2, -1e-4, 1e-4, 1e-2)] + [-math.log(n) - 0.5, 1e-6, 0.0]
    rows = torch.full((len(levels) + 1, V), -40.0)
    rows[:, 440] = 0.0  # the best text token: max_text = 0
    for i, level in enumerate(levels):
        rows[i, tb:] = level
    rows[-1, tb:] = float("-inf")  # no timestamp allowed at all
    expected = torch.logsumexp(rows[:, tb:], -1) > rows[:, :tb].amax(-1)
    ctx = [0, 1, 2, 3, 440, 2068]
    rules.apply(rows, [ctx] * len(rows))
    forced = torch.isinf(rows[:, :tb]).all(dim=-1)
    assert forced.tolist() == expected.tolist() == [False, False, True, True, False, True, True, False]


def test_grammar_pairs_and_monotone_timestamps():
    tok, rules = _rules()
    tb = tok.timestamp_begin
    rows = torch.zeros(3, 51865)
    contexts = [
        [0, 1, 2, 3],  # nothing sampled: a timestamp ≤ 1.0 s must come first
        [0, 1, 2, 3, tb + 10, 440],  # open segment after text: timestamps from tb+11 on
        [0, 1, 2, 3, tb + 10, 440, tb + 30],  # open timestamp: close it with one (≥ tb+30) or end
    ]
    rules.apply(rows, contexts)
    assert torch.isinf(rows[0, :tb]).all() and torch.isfinite(rows[0, tb : tb + 51]).all()
    assert torch.isinf(rows[0, tb + 51 :]).all()
    assert torch.isinf(rows[1, tb : tb + 11]).all() and torch.isfinite(rows[1, tb + 11]).all()
    assert torch.isinf(rows[2, : tok.eot]).all() and torch.isinf(rows[2, tb : tb + 30]).all()
    assert torch.isfinite(rows[2, tb + 30])  # (eot too was allowed, until the uniform row forced a timestamp)


def test_reduced_rows_keep_the_full_chains_logits():
    """`on_vocab`: the chain on rows over a sorted token subset (a distilled draft's columns)
    leaves exactly the logits the full chain leaves on those tokens, in every grammar state,
    with timestamps missing from the subset and rows where the timestamp mass wins."""
    tok = random_tiny_pair(seed=0).tokenizer
    tb, V = tok.timestamp_begin, 51865
    chain = build_filters(
        tok,
        vocab_size=V,
        sample_begin=4,
        suppress_tokens=[220, 1001, 1002, 50360],
        begin_suppress_tokens=[220, tok.eot],
        suppress_blank=True,
        timestamps=True,
    )
    ids = {tok.eot, tok.no_timestamps, 220, 1001, *range(0, tb, 3), *range(tb, V, 2), tb + 11, tb + 31}
    ids = sorted(ids)
    g = torch.Generator().manual_seed(1)
    contexts = [
        [0, 1, 2, 3],  # nothing sampled
        [0, 1, 2, 3, tb + 10, 440],  # open segment after text
        [0, 1, 2, 3, tb + 10, 440, tb + 30],  # open timestamp
        [0, 1, 2, 3, tb + 10, 440, tb + 30, tb + 30],  # closed pair
        [0, 1, 2, 3, 440, 2068],  # text only
    ] * 4
    full = torch.full((len(contexts), V), float("-inf"))
    full[:, ids] = torch.randn(len(contexts), len(ids), generator=g) * 3
    full[10:, tb:] += 8.0  # the last rows: timestamps together outweigh any text token
    reduced = full[:, ids].clone()
    apply_filters(chain, full, contexts)
    apply_filters(on_vocab(chain, ids), reduced, contexts)
    assert torch.equal(full[:, ids], reduced)
    forced = torch.isinf(reduced[:, : ids.index(tok.eot) + 1]).all(dim=-1)
    assert forced.any() and not forced.all()  # both branches of the mass rule ran


def test_reduced_rows_without_timestamp_columns_are_never_forced():
    """A reduced vocabulary may hold no timestamp: its rows then have no timestamp mass, so
    the forcing rule leaves them as they are (and does not reduce over an empty slice)."""
    tok, rules = _rules()
    reduced = rules.on_vocab(list(range(1000)))  # every column below timestamp_begin
    rows = torch.randn(2, 1000, generator=torch.Generator().manual_seed(1))
    before = rows.clone()
    reduced.apply(rows, [[0, 1, 2, 3, 5], [0, 1, 2, 3, 7]])
    assert torch.equal(rows, before)


def _random_contexts(tok, rules, rows: int, seed: int):
    """Contexts of every shape the rule branches on: nothing sampled yet, one token, closed
    pairs, open timestamps, text after text, with timestamps that do and do not repeat."""
    g = torch.Generator().manual_seed(seed)
    tb, begin = tok.timestamp_begin, rules.sample_begin
    out = []
    for _ in range(rows):
        ctx = list(range(begin))
        for _ in range(int(torch.randint(0, 9, (1,), generator=g))):
            if torch.rand(1, generator=g) < 0.5:
                ctx.append(tb + int(torch.randint(0, 60, (1,), generator=g)))
            else:
                ctx.append(int(torch.randint(0, 400, (1,), generator=g)))
        out.append(ctx)
    return out


def _device_form(rules, logits, contexts, columns=None, n_ts=None):
    from specasr.decode.filters import timestamp_rules_on_device

    S = max(map(len, contexts)) + 3
    tokens = torch.full((len(contexts), S), 7, dtype=torch.long)  # past each context: ignored
    for r, ctx in enumerate(contexts):
        tokens[r, : len(ctx)] = torch.tensor(ctx)
    context = torch.tensor([len(c) for c in contexts])
    return timestamp_rules_on_device(rules, logits, tokens, context, columns, n_ts)


def test_the_device_form_decides_as_the_host_rule():
    """`timestamp_rules_on_device` (tensors only, for the CUDA graph loop) leaves the same
    logits as `TimestampRules.apply` on every branch, forcing included."""
    tok, rules = _rules()
    tb, V = tok.timestamp_begin, 51865
    contexts = _random_contexts(tok, rules, 256, seed=1)
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(256, V, generator=g) * 3
    logits[:, tb:] += torch.linspace(-8, 4, 256)[:, None]  # forcing decided every way, band included
    host = logits.clone()
    rules.apply(host, contexts)
    device = _device_form(rules, logits, contexts)
    assert torch.equal(device, host)
    forced = torch.isinf(host[:, :tb]).all(1)
    assert 0 < int(forced.sum()) < 256  # both outcomes occur
    grammar = torch.isinf(host[:, tb:]).any(1) & ~forced
    assert int(grammar.sum()) > 10  # and rows the pair/monotone rules cut


def test_the_device_form_on_reduced_columns():
    tok, rules = _rules()
    tb, V = tok.timestamp_begin, 51865
    ids = sorted(set(range(0, tb, 7)) | set(range(tb, V, 3)))  # a reduced vocabulary, no <|notimestamps|>
    contexts = _random_contexts(tok, rules, 128, seed=3)
    logits = torch.randn(128, len(ids), generator=torch.Generator().manual_seed(4)) * 3
    n_ts = sum(i >= tb for i in ids)
    logits[:, -n_ts:] += torch.linspace(-8, 4, 128)[:, None]
    host = logits.clone()
    rules.on_vocab(ids).apply(host, contexts)
    assert torch.equal(_device_form(rules, logits, contexts, torch.tensor(ids), n_ts), host)

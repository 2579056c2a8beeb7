"""The capture-safe, device-side greedy loop (`decode.graphed`, issue 21): same tokens as the
host loop, fixed pass shapes, and one host read per step."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import with_self_draft
from torch.utils._python_dispatch import TorchDispatchMode
from toy import TOY_FRAMES, toy_pair

from specasr.decode import graphed
from specasr.decode.gamma import AdaptiveGamma, FixedGamma
from specasr.decode.graphed import GraphedGreedy, decode_graphed
from specasr.decode.loop import decode, decode_states
from specasr.decode.task import Task
from specasr.options import DecodeOptions
from specasr.runtime.runner import LeanDecoder

MAX_NEW = 40
AR = DecodeOptions(mode="autoregressive", max_new_tokens=MAX_NEW)
HOST = replace(AR, device_loop=False)  # the host loop on CUDA too (where AR would take the device loop)


@pytest.fixture(scope="module")
def tiny():
    """Random models over a toy vocabulary whose next tokens vary with the context (random
    models over Whisper's vocabulary repeat one token), drafted by the target's first layer:
    it agrees often but not always, so steps accept different counts per row."""
    return with_self_draft(toy_pair(seed=3), 1)


def _mels(batch: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mel = torch.randn(3, 80, TOY_FRAMES, generator=g).flip(0) * 20  # [3, 80, frames]: rows that differ
    return mel[:batch]  # at seed 0 the first row decodes 40 tokens, the others end sooner


@pytest.fixture(params=["lean", "eager"])
def runner_kind(request, monkeypatch):
    """Both decoder forms: `LeanDecoder` (CPU fp32) and the model's own layers (CUDA's)."""
    if request.param == "eager":
        monkeypatch.setattr(LeanDecoder, "supports", staticmethod(lambda model: False))
    return request.param


@pytest.mark.parametrize("gamma", [0, 1, 3, 8])
@pytest.mark.parametrize("batch", [1, 3])
def test_device_loop_gives_the_host_loops_greedy_tokens(tiny, runner_kind, gamma, batch):
    mel = _mels(3)[:batch]
    reference = decode(tiny, mel, AR)
    target_states, draft_states = tiny.encode(mel)
    tokens, state = decode_graphed(tiny, target_states, draft_states, AR, gamma)
    assert tokens == [r.tokens for r in reference]
    avg = (state.sum_logprob / torch.tensor([len(t) + 1 for t in tokens])).tolist()
    assert avg == pytest.approx([r.avg_logprob for r in reference], abs=1e-4)
    assert state.no_speech.tolist() == pytest.approx([r.no_speech_prob for r in reference], abs=1e-5)
    if gamma:
        assert 0 < state.accepted < state.proposed  # both paths: accepted drafts and rejections
        if batch > 1 and gamma >= 3:  # rows accepted different counts in a step: ragged rows kept apart
            assert any(len({n for n in step if n >= 0}) > 1 for step in state.history)


def test_a_row_stops_at_its_token_limit(tiny):
    short = DecodeOptions(mode="autoregressive", max_new_tokens=5)
    reference = [r.tokens for r in decode(tiny, _mels(3), short)]
    assert max(map(len, reference)) == 5  # the limit cut at least one row
    target_states, draft_states = tiny.encode(_mels(3))
    assert decode_graphed(tiny, target_states, draft_states, short, 8)[0] == reference


class _HostReads(TorchDispatchMode):
    """Counts the ops that read a value back to the host or size an output by the data (each
    a synchronisation on a GPU, and a capture error inside a CUDA graph)."""

    SYNCING = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "lift_fresh", "item")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(name in str(func) for name in self.SYNCING):
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_step_reads_the_device_once_and_keeps_its_shapes(tiny, monkeypatch):
    target_states, draft_states = tiny.encode(_mels(3))
    task = Task.build(tiny, AR, "en", None)
    loop = GraphedGreedy(tiny, AR, task, gamma=4)
    state, target, draft = loop.start(target_states, draft_states)
    shapes, tolist = set(), []
    real_pass, real_tolist = graphed.fixed_pass, torch.Tensor.tolist
    monkeypatch.setattr(
        graphed, "fixed_pass", lambda r, t, p: shapes.add(tuple(t.shape)) or real_pass(r, t, p)
    )
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: tolist.append(self.shape) or real_tolist(self))
    steps = 0
    with _HostReads() as spy:
        while True:
            steps += 1
            host = loop.step(state, target, draft)
            if all(host[3:]):
                break
    assert steps > 3
    assert spy.seen == []  # no .item(), bool(tensor), nonzero or host-made tensor inside a step
    assert len(tolist) == steps == state.reads  # the one read per step
    # draft T = 2, draft T = 1, target: the matched width (AR's auto drafts γ 5 without timestamps)
    assert shapes == {(3, 2), (3, 1), (3, 6)} and loop.width == 6


def test_refuses_what_it_cannot_do_on_the_device(tiny):
    task = Task.build(tiny, AR, "en", None)
    with pytest.raises(ValueError, match="temperature 0"):
        GraphedGreedy(tiny, DecodeOptions(mode="autoregressive", temperature=0.5), task, 0)


@pytest.mark.parametrize("gamma", [0, 3])
def test_timestamped_decoding_on_the_device_gives_the_host_loops_tokens(gamma):
    """Timestamp rules as tensor operations over each position's context: the same tokens as
    the host loop, timestamps included, for drafted and verified positions alike."""
    from tiny_pairs import random_tiny_pair

    pair = random_tiny_pair(seed=1)
    stamped = DecodeOptions(mode="autoregressive", timestamps=True, max_new_tokens=30)
    mel = torch.randn(2, 80, 3000, generator=torch.Generator().manual_seed(0))
    reference = [r.tokens for r in decode(pair, mel, stamped)]
    tb = pair.tokenizer.timestamp_begin
    assert all(row and row[0] >= tb for row in reference)  # the rules were at work
    states = pair.encode(mel)
    tokens, state = decode_graphed(pair, *states, stamped, gamma)
    assert tokens == reference
    if gamma:
        assert state.proposed > 0


@pytest.mark.slow
def test_timestamped_long_form_windows_with_the_packaged_draft(base_pair, librivox_mels):
    """Real timestamps (segments, pairs, monotone times) from the device loop on base and its
    draft: the host loop's tokens, and most proposals kept."""
    from specasr.models.draft import load_draft
    from specasr.models.loading import packaged_draft

    draft = load_draft(packaged_draft("base"), base_pair.target, torch.float32, torch.device("cpu"))
    pair = replace(base_pair, draft=draft.quantize_int8(), shared_encoder=True)
    mel = torch.cat(list(librivox_mels.values())[:2])  # [2, 80, 3000]
    opts = DecodeOptions(mode="autoregressive", language="en", timestamps=True)
    reference = [r.tokens for r in decode(pair, mel, opts)]
    tb = pair.tokenizer.timestamp_begin
    assert all(sum(t >= tb for t in row) >= 2 for row in reference)
    states, _ = pair.encode(mel)
    tokens, state = decode_graphed(pair, states, states, opts, gamma=5)
    assert tokens == reference
    assert state.accepted / state.proposed > 0.5


@pytest.mark.slow
def test_device_loop_with_the_packaged_draft_matches_the_host_loop(base_pair, librivox_mels):
    from dataclasses import replace

    from specasr.models.draft import load_draft
    from specasr.models.loading import packaged_draft

    draft = load_draft(packaged_draft("base"), base_pair.target, torch.float32, torch.device("cpu"))
    pair = replace(base_pair, draft=draft.quantize_int8(), shared_encoder=True)
    mel = torch.cat(list(librivox_mels.values())[:3])  # [3, 80, 3000]
    opts = DecodeOptions(mode="autoregressive", language="en")
    reference = [r.tokens for r in decode(pair, mel, opts)]
    states, _ = pair.encode(mel)
    tokens, state = decode_graphed(pair, states, states, opts, gamma=5)
    assert tokens == reference
    assert state.accepted / state.proposed > 0.5  # a real draft: most proposals are kept


def test_a_step_changes_its_state_in_place(tiny):
    """What a CUDA graph replays must find every tensor where the capture saw it: a step may
    write the state and the caches, never rebind them."""
    target_states, draft_states = tiny.encode(_mels(3))
    loop = GraphedGreedy(tiny, AR, Task.build(tiny, AR, "en", None), gamma=3)
    state, target, draft = loop.start(target_states, draft_states)

    def where() -> list[tuple[int, int]]:
        held = [state.seq, state.lengths, state.done, state.sum_logprob, state.no_speech]
        for r in (target, draft):
            held += [*r.k, *r.v, *(t for kv in r.cross for t in kv)]
        return [(id(t), t.data_ptr()) for t in held]

    before, lengths = where(), state.lengths.clone()
    for _ in range(3):
        loop.step(state, target, draft)
    assert where() == before
    assert (state.lengths > lengths).all()  # the steps did write: every row grew


def test_a_later_decode_reuses_the_workspace(tiny):
    """A second decode of the same shape runs in the first one's tensors (on CUDA: its graph),
    refilled with the new encoder states, and gives the host loop's tokens."""
    task = Task.build(tiny, AR, "en", None)
    loop = GraphedGreedy(tiny, AR, task, gamma=3)
    first, state = loop.run(*tiny.encode(_mels(3)))
    runners = (loop._current.target, loop._current.draft)
    other = torch.randn(3, 80, TOY_FRAMES, generator=torch.Generator().manual_seed(5)) * 20
    tokens, again = loop.run(*tiny.encode(other))
    assert again is state and (loop._current.target, loop._current.draft) == runners
    assert len(loop.workspaces) == 1
    assert tokens == [r.tokens for r in decode(tiny, other, AR)] != first
    assert loop.run(*tiny.encode(_mels(3)))[0] == first
    a = decode_graphed(tiny, *tiny.encode(_mels(3)), AR, 3)
    assert decode_graphed(tiny, *tiny.encode(_mels(3)), AR, 3)[1] is a[1]  # decode_graphed keeps its loop


def test_refilling_a_kept_loop_leaves_each_windows_projection_alone(tiny):
    """The kept runners' cross K/V are their own: refilling them with window b's leaves the
    projection window a's decodes share (`make_runner`) as it was."""
    task = Task.build(tiny, AR, "en", None)
    loop = GraphedGreedy(tiny, AR, task, gamma=3)
    a, b = tiny.encode(_mels(1)), tiny.encode(_mels(1, seed=1))
    first, _ = loop.run(*a)
    assert loop.run(*b)[0] != first  # b's cross K/V are now in the kept runners
    assert [r.tokens for r in decode_states(tiny, *a, AR)] == first


def test_every_window_of_a_recording_shares_one_kept_loop(tiny, monkeypatch):
    """Long-form decodes window k with seed + k, which a loop at T = 0 never reads: all its
    windows must share one kept loop (on CUDA: its graphs), not capture anew per window."""
    monkeypatch.setattr(graphed, "_LOOPS", {})
    states = tiny.encode(_mels(3))
    first = decode_graphed(tiny, *states, replace(AR, seed=0), 3)
    for k in range(1, graphed.KEPT_LOOPS + 3):  # more windows than loops kept
        tokens, state = decode_graphed(tiny, *states, replace(AR, seed=k), 3)
        assert state is first[1] and tokens == first[0]
    assert len(graphed._LOOPS) == 1


def test_the_kept_loops_drop_the_least_recently_used(tiny, monkeypatch):
    """Past `KEPT_LOOPS` loops the oldest use goes, not all of them: a loop in steady use
    (the app's current mode between others) keeps its graphs."""
    monkeypatch.setattr(graphed, "_LOOPS", {})
    states = tiny.encode(_mels(3))
    kept = decode_graphed(tiny, *states, AR, 3)[1]
    for n in range(graphed.KEPT_LOOPS):
        decode_graphed(tiny, *states, replace(AR, max_new_tokens=MAX_NEW - 1 - n), 3)
        assert decode_graphed(tiny, *states, AR, 3)[1] is kept
    assert len(graphed._LOOPS) == graphed.KEPT_LOOPS


def test_graphs_need_a_cuda_device(tiny):
    with pytest.raises(ValueError, match="CUDA"):
        GraphedGreedy(tiny, AR, Task.build(tiny, AR, "en", None), 3, graphs=True)


CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def tiny_cuda():
    from dataclasses import replace

    pair = toy_pair(seed=3)
    pair = replace(pair, target=pair.target.to("cuda"), draft=None, device=torch.device("cuda"))
    return with_self_draft(pair, 1)


@needs_cuda
@pytest.mark.parametrize("gamma", [0, 3])
def test_cuda_graph_replays_give_the_host_loops_tokens(tiny_cuda, gamma):
    mel = _mels(3)
    reference = [r.tokens for r in decode(tiny_cuda, mel, HOST)]
    target_states, draft_states = tiny_cuda.encode(mel.to("cuda"))
    loop = GraphedGreedy(tiny_cuda, AR, Task.build(tiny_cuda, AR, "en", None), gamma)
    assert loop.graphs  # on by default on CUDA
    tokens, state = loop.run(target_states, draft_states)
    assert tokens == reference
    assert loop.capture_error is None and loop.captures == 1
    assert 0 < state.replays == state.passes - graphed.WARM_STEPS
    tokens, state = loop.run(target_states, draft_states)  # the kept graph, every step
    assert tokens == reference and loop.captures == 1 and state.replays == state.passes
    assert len(loop._current.start_graphs) == 1  # the second decode captured its prefill too
    other = torch.randn(3, 80, TOY_FRAMES, generator=torch.Generator().manual_seed(5)) * 20
    tokens, _ = loop.run(*tiny_cuda.encode(other.to("cuda")))  # new states through the start graph
    assert tokens == [r.tokens for r in decode(tiny_cuda, other, HOST)] != reference
    assert loop.run(target_states, draft_states)[0] == reference


@needs_cuda
def test_cuda_graphs_for_every_gamma_a_policy_may_pick(tiny_cuda):
    mel = _mels(3)
    reference = [r.tokens for r in decode(tiny_cuda, mel, HOST)]
    states = tiny_cuda.encode(mel.to("cuda"))
    loop = GraphedGreedy(tiny_cuda, AR, Task.build(tiny_cuda, AR, "en", None), AdaptiveGamma(3, 6))
    for _ in range(2):
        tokens, state = loop.run(*states)
        assert tokens == reference
    assert loop.capture_error is None and loop.captures == 6  # γ = 1 … 6, captured once
    assert state.replays == state.passes and len(set(state.gammas)) > 1


@needs_cuda
@pytest.mark.parametrize("graphs", [False, True])
def test_cuda_step_never_synchronises_but_for_its_one_read(tiny_cuda, graphs, monkeypatch):
    """CUDA's sync debug mode raises on any synchronising call inside a step (eager, or a
    graph replay after a first decode captured it); only `Steps.read` may synchronise."""
    target_states, draft_states = tiny_cuda.encode(_mels(3).to("cuda"))
    loop = GraphedGreedy(tiny_cuda, AR, Task.build(tiny_cuda, AR, "en", None), 3, graphs=graphs)
    if graphs:
        loop.run(target_states, draft_states)  # warm-ups and the capture (which synchronises once)
    real_read = graphed.Steps.read

    def read(self, flags):
        torch.cuda.set_sync_debug_mode("default")
        try:
            return real_read(self, flags)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    monkeypatch.setattr(graphed.Steps, "read", read)
    state, target, draft = loop.start(target_states, draft_states)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        while not all(loop.step(state, target, draft)[3:]):
            pass
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert state.passes > 3 and state.reads == state.passes
    assert state.replays == (state.passes if graphs else 0)


@pytest.mark.parametrize("runner_kind", ["eager"], indirect=True)
def test_an_adaptive_gamma_picks_each_steps_gamma_from_its_read(tiny, runner_kind):
    """γ policy on the device loop: γ moves with the accepted counts the one read brings
    back (+2 when every proposal was kept, else −1), and the tokens stay the host loop's."""
    mel = _mels(3)
    reference = [r.tokens for r in decode(tiny, mel, AR)]
    loop = GraphedGreedy(tiny, AR, Task.build(tiny, AR, "en", None), AdaptiveGamma(3, 6))
    tokens, state = loop.run(*tiny.encode(mel))
    assert tokens == reference
    assert state.gammas[0] == 3 and len(set(state.gammas)) > 1 and max(state.gammas) <= 6
    for g, rows, nxt in zip(state.gammas, state.history, state.gammas[1:]):
        fewest = min(n for n in rows if n >= 0)
        assert nxt == (min(6, g + 2) if fewest >= g else max(1, g - 1))
    again, second = loop.run(*tiny.encode(mel))  # a later decode starts from γ = 3 again
    assert again == reference and second.gammas == state.gammas
    with pytest.raises(ValueError, match="gamma_max"):
        GraphedGreedy(tiny, AR, Task.build(tiny, AR, "en", None), FixedGamma(3))


def test_device_results_are_the_host_loops_results(tiny):
    """`decode_states`' rows from the device loop: the host loop's tokens, text, scores and
    language, token kinds that say where each token came from, and the speculative counts."""
    from specasr.decode.graphed import device_results
    from specasr.decode.loop import decode_states
    from specasr.stats import DecodeStats

    target_states, draft_states = tiny.encode(_mels(3))
    for mode, plan in (("autoregressive", 0), ("exact", 3)):
        opts = replace(AR, mode=mode, language="en")
        host = decode_states(tiny, target_states, draft_states, opts)
        stats = DecodeStats()
        task = Task.build(tiny, opts, "en", None)
        rows = device_results(tiny, target_states, draft_states, opts, task, plan, stats)
        assert [r.tokens for r in rows] == [r.tokens for r in host]
        assert [r.text for r in rows] == [r.text for r in host]
        assert [r.avg_logprob for r in rows] == pytest.approx([r.avg_logprob for r in host], abs=1e-4)
        assert [r.no_speech_prob for r in rows] == pytest.approx([r.no_speech_prob for r in host], abs=1e-5)
        assert all(r.language == "en" and r.stats is stats for r in rows)
        assert all(len(r.token_kinds) == len(r.tokens) for r in rows)
        kinds = {k for r in rows for k in r.token_kinds}
        assert stats.target_calls == len(stats.gammas) > 0 and set(stats.gammas) == {plan}
        if plan:
            assert {"draft", "corrected"} <= kinds <= {"draft", "corrected", "bonus"}
            assert 0 < stats.accepted < stats.proposed and stats.rejected > 0
            assert sum(r.token_kinds.count("draft") for r in rows) <= stats.accepted
        else:
            assert kinds == {"target"} and stats.proposed == 0
        assert stats.emitted >= sum(len(r.tokens) for r in rows)


def test_the_device_loop_takes_greedy_untimestamped_cuda_decodes_only(tiny):
    from specasr.decode.graphed import DEVICE_GAMMA, DEVICE_GAMMA_TIMESTAMPS, device_loop_plan
    from specasr.decode.step import Hooks

    cuda = replace(tiny, device=torch.device("cuda"))  # the plan reads the device's type only
    exact = replace(AR, mode="exact")

    def plan(pair=cuda, opts=exact, prompt=None, hooks=None):
        return device_loop_plan(pair, opts, Task.build(pair, opts, "en", prompt), hooks)

    assert plan(opts=AR) == 0
    assert plan() == min(exact.gamma, DEVICE_GAMMA)
    assert plan(opts=replace(exact, gamma_policy="fixed", gamma=3)) == 3
    adaptive = plan(opts=replace(exact, gamma_policy="adaptive", gamma=4))
    assert isinstance(adaptive, AdaptiveGamma) and (adaptive.gamma, adaptive.gamma_max) == (4, 8)
    assert plan(pair=tiny) is None  # a CPU
    assert plan(opts=replace(exact, temperature=0.5)) is None
    assert plan(opts=replace(exact, timestamps=True)) is None  # English-only: a start of one token
    from tiny_pairs import random_tiny_pair

    multilingual = replace(random_tiny_pair(seed=1), device=torch.device("cuda"))
    stamped = replace(exact, timestamps=True)
    # the rules run on the device; auto drafts fewer tokens with timestamps
    assert plan(multilingual, stamped) == min(exact.gamma, DEVICE_GAMMA_TIMESTAMPS) < DEVICE_GAMMA
    assert plan(multilingual, replace(stamped, gamma_policy="fixed", gamma=5)) == 5
    assert plan(opts=replace(exact, device_loop=False)) is None
    assert plan(opts=replace(exact, timing=True)) is None
    assert plan(prompt=[5, 6]) == plan()  # prompts too
    assert plan(hooks=Hooks(on_pass=print)) is None
    assert plan(hooks=Hooks()) == plan()


@needs_cuda
def test_cuda_decodes_take_the_device_loop_with_the_host_loops_tokens(tiny_cuda):
    mel = _mels(3)
    for mode in ("autoregressive", "exact"):
        opts = replace(AR, mode=mode)
        host = decode(tiny_cuda, mel, replace(opts, device_loop=False))
        device = decode(tiny_cuda, mel, opts)
        assert [r.tokens for r in device] == [r.tokens for r in host]
        gammas = set(device[0].stats.gammas)
        assert gammas == ({0} if mode == "autoregressive" else {5})  # the device loop's fixed γ


@pytest.mark.parametrize("stamped", [False, True])
def test_prompts_of_any_length_in_one_loop(stamped):
    """Windows prompted with the text before (long-form's sequential decoding): one loop, one
    workspace, start sequences of 4 to 70 tokens (prefill length buckets 4 … 128, and a
    bucket revisited), each decode the host loop's tokens for its prompt."""
    from tiny_pairs import random_tiny_pair

    from specasr.decode.loop import decode_states

    pair = random_tiny_pair(seed=1)
    opts = DecodeOptions(mode="autoregressive", timestamps=stamped, max_new_tokens=24, language="en")
    mel = torch.randn(2, 80, 3000, generator=torch.Generator().manual_seed(0))
    states, _ = pair.encode(mel)
    text = list(range(300, 366))  # 66 text tokens to prompt with
    loop, seen = None, set()
    for n in (0, 5, 66, 2, 30, 7):
        prompt = text[:n] or None
        reference = [r.tokens for r in decode_states(pair, states, states, opts, prompt)]
        seen.add(str(reference))
        task = Task.build(pair, opts, "en", prompt)
        loop = loop or GraphedGreedy(pair, opts, task, 2)
        tokens, state = loop.run(states, states, task)
        assert tokens == reference, n
    assert len(loop.workspaces) == 1
    assert len(seen) > 2  # the prompts steer the decodes: each really read its own
    assert decode_graphed(pair, states, states, opts, 2, prompt=text[:9])[0] == [
        r.tokens for r in decode_states(pair, states, states, opts, text[:9])
    ]


@pytest.mark.parametrize("keep", [None, 4, 0])
def test_the_draft_reads_only_the_prompts_tail(monkeypatch, keep):
    """As the host loop's `PromptTail`: the device loop's draft sees <|startofprev|>, then the
    context past prompt token `drop` (all but the last `draft_prompt` prompt tokens), at
    positions that run `drop` behind the target's; the target reads the whole prompt, so the
    tokens are the host loop's whatever the draft reads."""
    from tiny_pairs import random_tiny_pair

    from specasr.decode.loop import decode_states

    pair = random_tiny_pair(seed=1)
    opts = DecodeOptions(mode="exact", max_new_tokens=24, language="en", draft_prompt=keep)
    states, _ = pair.encode(torch.randn(2, 80, 3000, generator=torch.Generator().manual_seed(0)))
    prompt = list(range(300, 330))  # 30 prompt tokens
    task = Task.build(pair, opts, "en", prompt)
    loop = GraphedGreedy(pair, opts, task, 2)
    calls, real = [], graphed.fixed_pass

    def spy(runner, tokens, pos, **kw):
        calls.append((runner, tokens.clone(), pos.clone()))
        return real(runner, tokens, pos, **kw)

    monkeypatch.setattr(graphed, "fixed_pass", spy)
    tokens, state = loop.run(states, states, task)
    assert tokens == [r.tokens for r in decode_states(pair, states, states, opts, prompt)]
    drop = {None: 0, 4: 26, 0: 30}[keep]
    assert loop.drop(task) == drop
    draft = loop.workspaces[next(iter(loop.workspaces))].draft
    seq, P = state.seq, len(task.init)  # [B, 448]: the final contexts
    tail = torch.cat([seq[:, :1], seq[:, 1 + drop :]], 1)  # [B, 448 - drop]: what the draft reads
    fed = [(t, p) for r, t, p in calls if r is draft]
    prefill, starts = fed[0], [(t, p) for t, p in fed[1:] if t.shape[1] == 2]
    real_rows = prefill[1][0] <= P - 2 - drop  # the prefill's positions that hold the start sequence
    assert torch.equal(prefill[0][:, real_rows], tail[:, : int(real_rows.sum())])
    assert len(starts) == state.passes > 0
    for t, p in starts:  # each step feeds the last two context tokens at their draft positions
        assert torch.equal(t, tail.gather(1, p)), p
    assert state.accepted > 0


@needs_cuda
def test_cuda_prompts_and_timestamps_through_the_graphs():
    """Sequential long-form's decodes on CUDA: prompts of several lengths (several prefill
    graphs), timestamps, replays after the first round: the host loop's tokens each time."""
    from tiny_pairs import random_tiny_pair

    from specasr.decode.graphed import DEVICE_GAMMA_TIMESTAMPS
    from specasr.decode.loop import decode_states

    pair = random_tiny_pair(seed=1, device="cuda")
    opts = DecodeOptions(mode="exact", timestamps=True, max_new_tokens=24, language="en")
    mel = torch.randn(2, 80, 3000, generator=torch.Generator().manual_seed(0)).to("cuda")
    states, _ = pair.encode(mel)
    text = list(range(300, 366))
    for _ in range(2):
        for n in (0, 5, 66, 30):
            prompt = text[:n] or None
            host = decode_states(pair, states, states, replace(opts, device_loop=False), prompt)
            device = decode_states(pair, states, states, opts, prompt)
            assert [r.tokens for r in device] == [r.tokens for r in host], n
            # the device loop's fixed γ with timestamps (the host loop's stop drafts 1 here)
            assert set(device[0].stats.gammas) == {DEVICE_GAMMA_TIMESTAMPS}


def test_the_matched_width_is_one_more_than_the_largest_gamma_the_options_draft():
    from specasr.decode.graphed import DEVICE_GAMMA, DEVICE_GAMMA_TIMESTAMPS, matched_width

    assert matched_width(AR) == DEVICE_GAMMA + 1  # auto, text only
    assert matched_width(replace(AR, timestamps=True)) == DEVICE_GAMMA_TIMESTAMPS + 1
    assert matched_width(replace(AR, gamma=1)) == 2  # auto never drafts past options.gamma
    assert matched_width(replace(AR, gamma_policy="adaptive", gamma=3, gamma_max=12)) == 9
    assert matched_width(replace(AR, gamma_policy="fixed", gamma=4)) == 5
    with pytest.raises(ValueError, match="device_width"):
        replace(AR, device_width="wide")


@pytest.mark.parametrize("width", ["matched", "natural"])
def test_every_mode_runs_the_targets_passes_at_one_width(tiny, monkeypatch, width):
    """Matched: target-only and speculative loops of the same options pass the target the same
    number of tokens per row (padding past γ + 1), so on a GPU each token's rounding is the
    same in both; natural: γ + 1. Either way the host loop's tokens."""
    opts = replace(AR, device_width=width)
    mel = _mels(3)
    reference = [r.tokens for r in decode(tiny, mel, HOST)]
    states = tiny.encode(mel)
    task = Task.build(tiny, opts, "en", None)
    real_pass = graphed.fixed_pass
    for gamma in (0, 3):
        loop = GraphedGreedy(tiny, opts, task, gamma)
        target = loop.start(*states)[1]
        widths = set()

        def spy(r, t, p, target=target, widths=widths, **kw):  # the steps' target passes
            if r is target and not kw.get("hidden"):  # (the prefill's is the same in every mode)
                widths.add(t.shape[1])
            return real_pass(r, t, p, **kw)

        monkeypatch.setattr(graphed, "fixed_pass", spy)
        assert loop.run(*states)[0] == reference
        monkeypatch.setattr(graphed, "fixed_pass", real_pass)
        assert widths == {loop.width} == {6 if width == "matched" else gamma + 1}


def _row_independence(pair, frames: int = TOY_FRAMES) -> None:
    """In a pass of fixed shape a row's logits depend on its own token, position and cache
    alone: not on the other rows' tokens, nor on which row it is."""
    from specasr.decode.runners import make_runner

    mel = torch.randn(2, 80, frames, generator=torch.Generator().manual_seed(0)) * 20
    states = pair.encode(mel.to(pair.device, pair.dtype))[0]
    runner = make_runner(pair.target, states, private=True)
    n, B = pair.target.config.vocab_size, states.shape[0]
    g = torch.Generator().manual_seed(1)
    toks = lambda k: torch.randint(0, n, (B, k), generator=g).to(pair.device)  # noqa: E731
    span = lambda a, k: (a + torch.arange(k, device=pair.device)).expand(B, k)  # noqa: E731
    graphed.fixed_pass(runner, toks(8), span(0, 8))  # a context at positions 0 … 7
    t = toks(4)
    first = graphed.fixed_pass(runner, t, span(8, 4))  # [B, 4, V]
    other = graphed.fixed_pass(runner, torch.cat([t[:, :2], toks(2)], 1), span(8, 4))
    assert torch.equal(first[:, :2], other[:, :2])  # rows 2, 3 changed: rows 0, 1 did not
    graphed.fixed_pass(runner, t, span(8, 4))  # positions 8 … 11 as in `first` again
    moved = graphed.fixed_pass(runner, torch.cat([t[:, 1:2], toks(3)], 1), span(9, 4))
    assert torch.equal(moved[:, 0], first[:, 1])  # t[1] at position 9 from row 0 instead of row 1
    assert not torch.equal(moved[:, 1], first[:, 2])


def test_a_rows_logits_depend_on_its_own_inputs_alone(tiny):
    _row_independence(tiny)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_a_rows_logits_depend_on_its_own_inputs_alone_on_cuda(dtype):
    """What exact's identity to target-only decoding rests on in the device loop (matched
    width): a GPU product's rounding follows its shape, never the other rows."""
    from tiny_pairs import random_tiny_pair

    _row_independence(random_tiny_pair(seed=2, device="cuda", dtype=dtype), 3000)


def test_a_start_graphs_prefill_projects_its_own_states(tiny):
    """A start graph records `_prefill(captured=True)`: its runners must project the states in
    the graph, never take cross K/V held for that states tensor (they would be an earlier
    graph's memory, stale at every replay but that graph's). The eager prefill may share them."""
    from specasr.decode import runners

    states = tiny.encode(_mels(1))[0]  # one row: a runner holds its cross K/V for the next
    loop = GraphedGreedy(tiny, AR, Task.build(tiny, AR, "en", None), gamma=2)
    loop.start(states, states)
    ws = loop._current
    stale = runners.make_runner(tiny.target, states)  # holds its projection of `states`
    with torch.inference_mode():
        for k, v in runners._held(states, stale.decoder).cross:
            k.zero_(), v.zero_()  # what another graph's memory would hold
        loop._prefill(ws, states, states, 4, captured=True)
        fresh = runners.make_runner(tiny.target, states, private=True)
        assert all(torch.equal(a, b) for ka, kb in zip(ws.target.cross, fresh.cross) for a, b in zip(ka, kb))
        assert any(k.any() for k, _ in ws.target.cross)
        loop._prefill(ws, states, states, 4)  # eager: the held (here zeroed) projection is shared
        assert all(not k.any() for k, _ in ws.target.cross)


@needs_cuda
def test_cuda_one_row_windows_with_prompts_in_several_buckets_read_their_own_audio():
    """Sequential long-form on CUDA: one row per window, a new window's states each decode,
    prompts in several prefill buckets (a start graph each): the host loop's tokens each time.
    (Held cross K/V once made every bucket's graph but the first decode a stale window.)"""
    from tiny_pairs import random_tiny_pair

    from specasr.decode.loop import decode_states

    pair = random_tiny_pair(seed=1, device="cuda")
    opts = DecodeOptions(mode="exact", timestamps=True, max_new_tokens=24, language="en")
    text = list(range(300, 366))
    for i, n in enumerate((0, 5, 66, 30, 5, 66)):
        mel = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(i)).to("cuda") * 5
        states, _ = pair.encode(mel)
        prompt = text[:n] or None
        host = decode_states(pair, states, states, replace(opts, device_loop=False), prompt)
        device = decode_states(pair, states, states, opts, prompt)
        assert [r.tokens for r in device] == [r.tokens for r in host], (i, n)

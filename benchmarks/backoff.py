"""Does speculation ever make decoding slower? Fixed γ against the backoff γ policy, per language.

    python -m benchmarks.backoff --model base --repeats 3 [--languages en,fr,es,de,it,pt]

The packaged base draft was distilled on English; on other languages it agrees with the
target far less, and a fixed γ then decodes slower than the target alone (issue 19). The
`backoff` policy (`specasr.decode.gamma.BackoffGamma`, the CPU default) counts acceptance
and falls back to target-only steps while speculation cannot pay at the stored cost curve.

Speech is synthesised with espeak-ng (a Debian package; `apt install espeak-ng`): the same
few sentences per language, one 30 s window each, so anyone can regenerate the audio from
the package and this file. Per language, autoregressive, exact with fixed γ and exact with
backoff decode every clip, interleaved, `--repeats` times, with the language given (no
detection). Reports the summed decoder-phase time (median over repeats) as speed against
autoregressive, per-token α̂ of the fixed run, the share of tokens backoff decoded
target-only, and whether all three gave the same tokens (T = 0). Synthetic speech is easier
than real speech for Whisper; the ratios, not the WER, are the point here.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import click

from specasr.options import DecodeOptions

SENTENCES = {
    "en": [
        "The quick brown fox jumps over the lazy dog near the river bank.",
        "Please call Stella and ask her to bring these things with her from the store.",
        "We will meet again on Thursday morning to talk about the new budget.",
    ],
    "fr": [
        "Le petit chat dort sur le canapé pendant que la pluie tombe dehors.",
        "Nous irons au marché demain matin pour acheter des légumes frais.",
        "Il faut terminer ce rapport avant la réunion de jeudi prochain.",
    ],
    "es": [
        "El perro corre por el parque mientras los niños juegan con la pelota.",
        "Mañana por la mañana vamos a visitar a mis abuelos en el pueblo.",
        "Por favor, cierra la ventana porque hace mucho frío esta noche.",
    ],
    "de": [
        "Der Zug nach Berlin fährt heute mit einer Stunde Verspätung ab.",
        "Wir haben am Wochenende einen langen Spaziergang im Wald gemacht.",
        "Bitte schicken Sie mir die Unterlagen bis spätestens Freitag.",
    ],
    "it": [
        "Il treno per Roma parte alle otto e mezza dalla stazione centrale.",
        "Domani andiamo al mare con gli amici se il tempo è bello.",
        "Ho dimenticato le chiavi di casa sul tavolo della cucina.",
    ],
    "pt": [
        "O menino comprou pão fresco na padaria perto da escola.",
        "Amanhã vamos viajar para o litoral com toda a família.",
        "Por favor, desligue as luzes antes de sair do escritório.",
    ],
    "ja": [
        "今日はとても良い天気なので、午後は公園を散歩しましょう。",
        "すみません、駅までの道を教えていただけますか。",
        "明日の会議は午後三時から第二会議室で始まります。",
    ],
    "zh": [
        "今天天气很好，我们下午去公园散步吧。",
        "请问去火车站应该怎么走？",
        "明天下午三点在二号会议室开会。",
    ],
    "hi": [
        "आज मौसम बहुत अच्छा है, चलो दोपहर में पार्क में घूमने चलते हैं।",
        "कृपया मुझे रेलवे स्टेशन का रास्ता बताइए।",
        "कल की बैठक दोपहर तीन बजे शुरू होगी।",
    ],
    "ar": [
        "الطقس جميل جدا اليوم، لنذهب إلى الحديقة بعد الظهر.",
        "من فضلك، كيف أصل إلى محطة القطار؟",
        "سيبدأ الاجتماع غدا في الساعة الثالثة بعد الظهر.",
    ],
}
ESPEAK_VOICE = {"zh": "cmn"}  # where espeak-ng names the voice otherwise than Whisper the language


def synthesise(lang: str, out_dir: Path) -> list[Path]:
    """One wav per sentence of `lang`, spoken by espeak-ng's default voice for it."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise click.ClickException("espeak-ng not found: apt install espeak-ng")
    paths = []
    for i, text in enumerate(SENTENCES[lang]):
        path = out_dir / f"{lang}-{i}.wav"
        subprocess.run(
            [exe, "-v", ESPEAK_VOICE.get(lang, lang), "-s", "150", "-w", str(path), text], check=True
        )
        paths.append(path)
    return paths


def _decoder_s(results) -> float:
    return sum(r.stats.decoder_s for r in results)


@click.command()
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True)
@click.option("--languages", default="en,fr,es,de,it,pt", show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True)
def main(model: str, draft: str, languages: str, repeats: int) -> None:
    from specasr.decode.loop import decode
    from specasr.eval.bench import file_mels
    from specasr.models.loading import load_pair

    pair = load_pair(model, draft)
    rows = []
    with tempfile.TemporaryDirectory(prefix="specasr-backoff-") as tmp:
        for lang in languages.split(","):
            mels = file_mels(pair, synthesise(lang, Path(tmp)))
            base = DecodeOptions(language=lang, timing=True)
            configs = {
                "autoregressive": replace(base, mode="autoregressive"),
                "fixed": replace(base, mode="exact", gamma_policy="fixed"),
                "backoff": replace(base, mode="exact", gamma_policy="backoff"),
            }
            times = {k: [] for k in configs}
            tokens, stats = {}, {}
            for rep in range(repeats + 1):  # the first round warms up
                for name, opts in configs.items():
                    results = [decode(pair, mel, opts)[0] for mel in mels]
                    if rep:
                        times[name].append(_decoder_s(results))
                    tokens[name] = [r.tokens for r in results]
                    stats[name] = results
            ar = statistics.median(times["autoregressive"])
            fixed_stats = [r.stats for r in stats["fixed"]]
            back_stats = [r.stats for r in stats["backoff"]]
            accepted = sum(s.accepted for s in fixed_stats)
            judged = accepted + sum(s.rejected for s in fixed_stats)
            target_only = sum(s.target_calls - len(s.gammas) for s in back_stats)  # B = 1: a token each
            emitted = sum(s.emitted for s in back_stats)
            rows.append(
                (
                    lang,
                    f"{accepted / max(judged, 1):.3f}",
                    f"{ar / statistics.median(times['fixed']):.2f}×",
                    f"{ar / statistics.median(times['backoff']):.2f}×",
                    f"{target_only / max(emitted, 1):.0%}",
                    "yes" if tokens["fixed"] == tokens["backoff"] == tokens["autoregressive"] else "NO",
                )
            )
    click.echo(f"{model} + {pair.draft_name}, {repeats} repeats, decoder phase vs autoregressive\n")
    header = (
        "language",
        "α̂ (fixed)",
        "exact, fixed γ",
        "exact, backoff",
        "backoff target-only tokens",
        "same",
    )
    click.echo("| " + " | ".join(header) + " |")
    click.echo("|---|---|---|---|---|---|")
    for row in rows:
        click.echo("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()

"""Option dataclasses: one place for defaults, one comment per field, validated once.

Front ends build these and override fields with `dataclasses.replace`; no parameter list
is copied into a second signature.
"""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("autoregressive", "baseline", "exact", "sigmoid")
GAMMA_POLICIES = ("fixed", "adaptive", "analytic")
BACKENDS = ("auto", "triton", "torch")


@dataclass(frozen=True)
class DecodeOptions:
    mode: str = "exact"  # autoregressive (target only) | baseline | exact | sigmoid verifier
    temperature: float = 0.0  # 0 = greedy; > 0 samples from softmax(logits / T)
    gamma: int = 5  # draft tokens per step: the fixed value, or the adaptive start
    gamma_policy: str = "adaptive"  # fixed | adaptive (+2 / -1 heuristic) | analytic (measured α, costs)
    gamma_max: int = 16  # upper bound for the adaptive and analytic policies
    language: str | None = "en"  # language code for multilingual models; None = detect (long-form)
    task: str = "transcribe"  # transcribe | translate
    timestamps: bool = False  # predict timestamp tokens (and apply Whisper's timestamp rules)
    max_new_tokens: int | None = None  # None = up to the model's 448-token context
    sigmoid_scale: tuple[float, float] = (-1e3, 1e3)  # (α, β) of the sigmoid verifier
    seed: int = 0  # seeds the torch.Generator behind every random draw
    suppress_blank: bool = True  # suppress " " and <|endoftext|> as the first sampled token
    suppress_tokens: bool = True  # suppress the model's non-speech tokens (generation config)
    backend: str = "auto"  # verifier backend: auto | triton | torch

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.gamma_policy not in GAMMA_POLICIES:
            raise ValueError(f"gamma_policy must be one of {GAMMA_POLICIES}, got {self.gamma_policy!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 1 <= self.gamma <= self.gamma_max:
            raise ValueError(f"need 1 <= gamma <= gamma_max, got {self.gamma} and {self.gamma_max}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.task not in ("transcribe", "translate"):
            raise ValueError(f"task must be transcribe or translate, got {self.task!r}")
        lo, hi = self.sigmoid_scale
        if not lo < hi:
            raise ValueError(f"sigmoid_scale needs α < β, got {self.sigmoid_scale}")

    @property
    def speculative(self) -> bool:
        return self.mode != "autoregressive"

"""WER evaluation: the metric on Whisper-normalised text (`metric`), the resumable runner
over datasets (`runner`), the paper-style table and plot (`report`), and `specasr bench`'s
side-by-side timing of speculative and autoregressive decoding (`bench`)."""

"""WER evaluation: the metric on Whisper-normalised text (`metric`), the resumable runner
over datasets (`runner`), and the paper-style table and plot (`report`)."""

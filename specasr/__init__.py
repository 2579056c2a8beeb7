"""specasr: Whisper transcription with exact speculative decoding."""

__version__ = "0.1.0"

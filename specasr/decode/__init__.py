"""Decoding one batch of 30 s windows: the loop (`loop`), its steps (`step`), the decoder
runners and their KV caches (`runners`), logit filters, γ and stop policies, statistics."""

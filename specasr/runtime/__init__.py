"""The runtime every device shares: the reference decoder layer (`layers`), the layer forms a
load chooses and passes in (`forms`), and the runner with its preallocated KV cache
(`runner`)."""

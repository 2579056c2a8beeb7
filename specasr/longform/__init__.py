"""Long-form transcription: windows and fallbacks (`windows`), Whisper's seek loop
(`sequential`), spans cut at pauses and decoded in batches, never overlapping (`chunked`),
segment end times (`timing`), word times (`words`), the spans decoded and their times mapped
back (`spans`: clip timestamps, and the speech `vad` finds), the hallucination skip
(`hallucination`), and where the model work runs (`engine`)."""

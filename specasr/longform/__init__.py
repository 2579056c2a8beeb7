"""Long-form transcription: windows and fallbacks (`windows`), Whisper's seek loop
(`sequential`), spans cut at pauses and decoded in batches, never overlapping (`chunked`),
segment end times (`timing`)."""

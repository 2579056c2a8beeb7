"""Long-form transcription: windows and fallbacks (`windows`), Whisper's seek loop
(`sequential`), overlapping batched windows (`chunked`), segment end times (`timing`)."""

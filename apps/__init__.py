"""Front ends for interactive use (the Gradio app lives here)."""

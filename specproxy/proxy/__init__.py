"""``specproxy proxy``: a transparent recording reverse proxy for OpenAI-compatible engines."""

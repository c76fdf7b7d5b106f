"""Views of the engine's live state, drawn from its trace events."""

"""The engine behind vLLM's OpenAI-compatible HTTP API: `minillm serve MODEL` (api_server.py)."""

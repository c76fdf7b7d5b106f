"""`minillm eval ...`: quality measurements of a model (perplexity, draft acceptance)."""

"""`minillm bench ...`: measurements printed as a table and written as JSON (see BENCHMARKS.md)."""

"""Built-in cluster descriptions (YAML): node hardware plus the fabric topology between nodes."""

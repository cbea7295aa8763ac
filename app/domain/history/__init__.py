"""History: reading the past of a bank, and undoing writes as new, attributed versions."""

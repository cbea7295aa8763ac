"""What each tenant's writes cost: chunks applied, model calls, prompt and completion tokens and texts
embedded, per UTC day, user and writer, summed from what the writer changesets recorded (exact, not
sampled). A tenant's admin reads its own (`GET /v1/admin/usage`); an operator every tenant's
(`memstore usage`)."""

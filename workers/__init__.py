"""arq worker processes: settings, start-up of shared clients, and thin job entry points."""

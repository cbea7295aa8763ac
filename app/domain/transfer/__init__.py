"""Transfer: a user's bank and its full history, exported from one instance and loaded into another."""

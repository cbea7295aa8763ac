"""Shadow banks: writers on trial write a tenant's chunks into banks of their own; comparison and replay."""

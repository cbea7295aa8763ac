"""Writers on trial: the same conversations written by each writer into a bank of its own, then the
same questions answered from each bank with retrieval, read model and judge held fixed."""

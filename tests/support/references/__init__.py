"""Drivers that run the reference frameworks' own code, each in a process of its own, against a fake
model server, so that what they send can be compared with what Memstore's profiles send
(tests/integration/writers/test_protocol_fidelity.py).

Each driver is `python -m tests.support.references.<name>` with a scenario as JSON on stdin; it imports
the reference release from the folder `memstore references install` put it in (never from the
service's own environment) and makes the calls that framework makes for the scenario. Storage,
embeddings and retrieval are stood in for where the framework needs them; the code that renders the
messages and calls the model is the framework's, unchanged.
"""

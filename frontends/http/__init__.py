"""What every HTTP resource shares: the worker's context (``ctx``: config,
arena port, vocabulary, template), one request's leases turned into text steps
with stop strings and disconnect checks (``gen``; each choice a ``job``), and SSE framing with its
back-pressure (``stream``).

May import frontends.text, engine and ipc; never frontends.api or
frontends.process.
"""

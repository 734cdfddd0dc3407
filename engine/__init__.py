"""The engine: the one process that owns the model and runs the decode loop.

It handles token ids only and never blocks on a reader: continuous batching
over N slots (loop.py, publish.py, slots.py, budget.py), the prefix cache over
every slot's KV and host RAM (prefix.py, lookup.py, kvcache.py, ramcache.py),
the sampler (sampling/), llama.cpp's context (model.py, lowlevel.py, vocab.py)
and the one Config (config.py). ``python -m engine`` is the process
(__main__.py; process.py starts it). It imports ipc/ only, never frontends/.
"""

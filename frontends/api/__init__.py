"""HTTP resources: one module per API family, and the app that routes to them.

``app.py`` is the index: its route table names every path and the resource
serving it. ``native`` (llama-server's /completion, /tokenize, ...),
``openai`` (/v1/completions, /v1/chat/completions), ``responses``,
``anthropic``, ``embed`` (embeddings, rerank), ``infill``, ``slotfile``,
``misc`` (/health, /props, /models, /slots, /metrics), ``metrics`` (the
Prometheus text), ``fleet`` (what gateways read: /v1/loads, /server_info,
/model_info) over ``load`` (the engine's load snapshot), ``openapi``,
``webui`` (the chat page; its files are in ``webui/``); ``auth`` and
``cors`` are the app's middleware.

May import frontends.http, frontends.text, engine and ipc; never
frontends.process.
"""

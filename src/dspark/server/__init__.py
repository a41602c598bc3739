"""The OpenAI-compatible HTTP server over the engine (DESIGN §10).

- ``app.py`` — ``create_app(worker, model_name)``: routes, admission (429), API key,
  client-disconnect cancellation;
- ``schemas.py`` — the wire format (pydantic), strictly validated;
- ``prepare.py`` — request → prompt ids + sampling params, checked against the engine;
- ``responses.py`` / ``textstream.py`` — response bodies, SSE, incremental detokenization;
- ``errors.py`` — ``{"error": {"message", "type"}}`` for every error, 4xx for bad input;
- ``metrics.py`` — Prometheus metrics in a registry per app;
- ``uvicorn_runner.py`` — ``dspark serve`` (wired in :mod:`dspark.commands.serve`), SIGTERM drains.

Nothing is imported here, so that the CLI table can import ``commands`` cheaply.
"""

"""A completion server for a checkpoint (`scripts/serve.py`): the wire formats editors and clients already speak,
TGI's and OpenAI's, over one engine that batches concurrent requests.

- `config.py`: `ServeConfig`, the script's flags (no heavy imports);
- `engine.py`: the thread that owns the model: continuous batching, per-sequence stopping, cancellation, bounds;
  `kv_batch.py`: the shared, left-padded KV cache that sequences join and leave between steps;
  `sampling.py`: per-request token choice, equal to `generate`'s for the same seed; `text.py`: incremental
  decoding and stop strings;
- `state.py`: what the routes share (prompt rules, limits, the engine-to-asyncio bridge);
- `tgi.py`, `openai_api.py`: each API's schema, validation and answers; `errors.py`: errors in each API's format;
- `app.py`: the FastAPI application (routes, auth, streams); `body_limit.py`: the bound on request bodies;
  `server.py`: loading, uvicorn, signals.

Nothing else in the project imports this package.
"""

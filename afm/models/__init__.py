"""Models and generation: `tiny` and SmolLM2 built or converted, the KV cache, the engine over token ids, engines by
name, serving and its clients, and the small test model the chapters run episodes with.

Its modules, in the order data flows:

- `afm.models.catalog` (06_catalog): The model and tokenizer factories: `tiny` trained here from scratch,
  SmolLM2-135M-Instruct converted from its packaged GGUF, the paper's models by hub name, all through `load`; and
  the model card a saved folder carries.
- `afm.models.kv_cache` (06a_kv_cache): The generation engine's cache: allocated once per batch, new keys and values
  written into it where they belong, slots for rows that join and leave; no concatenation and no rebuilding per
  decoding step.
- `afm.models.engine` (07_engine): Generation over token ids: token ids in, token ids and log-probabilities out,
  nothing re-tokenised; batched over one KV cache with continuous batching, a prefix cache and cancellation.
- `afm.models.backends` (07_backends): Where text and model names meet the engine of `afm.models.engine`, which sees
  only token ids: `EngineBackend` puts an engine behind the chat-backend protocol, `VLLMEngine` runs vLLM on GPUs,
  and `build_engine` makes an engine for a model by name or folder, on the device and in the dtype asked for.
- `afm.models.batching` (07a_batching): One continuous batch for concurrent callers (`BatchingEngine`), and text
  streamed as it is sampled, cancellable.
- `afm.models.server` (07a_server): `serve_chat` and `afm serve model`: the OpenAI API over an engine, strict,
  bounded, with errors in OpenAI's shape.
- `afm.models.remote` (07a_remote): `OpenAIEngine`: any OpenAI-compatible server behind `Engine`, token ids in and
  out, under one retry policy.
- `afm.models.fit` (07b_fit): The test model of the chapters that run episodes: the small `tiny`, fitted for a few
  seconds on one-search trajectories so that it calls a tool, and cached by what went into the fit."""

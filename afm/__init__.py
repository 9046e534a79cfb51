"""Chain-of-Agents: agent foundation models by multi-agent distillation and agentic RL, reproduced notebook-first

Modules:

- `afm.engine`: Generation over token ids: token ids in, token ids and log-probabilities out, nothing re-tokenised; batched over one KV cache with continuous batching, a prefix cache and cancellation.
- `afm.engine_local`: Where text and model names meet the engine of `afm.engine`, which sees only token ids: `EngineBackend` puts an engine behind the chat-backend protocol, `VLLMEngine` runs vLLM on GPUs, and `build_engine` makes an engine for a model by name or folder, on the device and in the dtype asked for."""

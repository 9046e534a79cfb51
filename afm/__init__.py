"""Chain-of-Agents: agent foundation models by multi-agent distillation and agentic RL, reproduced notebook-first

Modules:

- `afm.engine`: Generation over token ids: token ids in, token ids and log-probabilities out, nothing re-tokenised; batched over one KV cache with continuous batching, a prefix cache and cancellation; vLLM on GPUs; the local chat backend."""

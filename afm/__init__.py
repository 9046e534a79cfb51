"""Chain-of-Agents: agent foundation models by multi-agent distillation and agentic RL, reproduced notebook-first

afm is built in *wings*, one package a stage of the pipeline, in the order data flows: `afm.format`, `afm.core`,
`afm.tools`, `afm.tasks`, `afm.teacher`, `afm.models`, `afm.rollout`, `afm.sft`, `afm.rl` and `afm.report`, with the
`afm` command in `afm.cli`. Each wing's docstring says what the stage does and lists its modules, in the order data
flows (`afm.core.chapters.WINGS` and `CHAPTERS`).

Modules:

- `afm.models.backends`: Where text and model names meet the engine of `afm.models.engine`, which sees only token ids: `EngineBackend` puts an engine behind the chat-backend protocol, `VLLMEngine` runs vLLM on GPUs, and `build_engine` makes an engine for a model by name or folder, on the device and in the dtype asked for.
- `afm.models.engine`: Generation over token ids: token ids in, token ids and log-probabilities out, nothing re-tokenised; batched over one KV cache with continuous batching, a prefix cache and cancellation.
- `afm.rollout.evaluate`: Any engine on any suite or benchmark, `k` samples per task: graded records kept as JSONL that resume after a kill, pass@1, avg@k and the unbiased pass@k per suite with a 95% interval and chance beside it, Best-of-N by a verifier, a paired comparison of two models, validation that chooses and a test split that only reports; one writer per records file, and a failure of the engine never graded. The command, `afm eval`, is the sub-chapter `08a_eval_command`."""

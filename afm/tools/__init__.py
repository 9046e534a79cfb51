"""The tools an agent calls and the clients behind them: the LLM client, the tool registry and the toolbox, search,
crawl, the code sandbox and its warm pool, the harness a code grade runs, and the system prompt made from the
registry.

Its modules, in the order data flows:

- `afm.tools.llm` (01_llm): One client for OpenAI-compatible chat endpoints — one retry policy, bounded concurrency,
  load sharing across endpoints — and the chat-backend protocol that the teacher, the page summariser and the LLM
  judge depend on.
- `afm.tools.toolbox` (02_toolbox): The `Tool` interface, the registry and `@tool`, sessions with their limits, the
  record/replay cache, tool health and the circuit breaker, and the `Toolbox` every stage shares.
- `afm.tools.search` (02a_search): BM25 search over real documents, the Search-R1 retrieval server and its client,
  online search through Serper, and the `web_search` and `wiki_search` tools.
- `afm.tools.crawl` (02b_crawl): Reading pages: URLs in a model's input, HTML to text, goal-directed summaries
  (extractive or by an LLM), and the `crawl_page` tool.
- `afm.tools.sandbox` (02c_sandbox): One program in a bubblewrap sandbox under rlimits and a uid of its own:
  launched, read, ended with all it started.
- `afm.tools.execution` (02c_execution): `run_python`: model-written code in a fresh sandbox, what happened and what
  the model reads; a pool if given one.
- `afm.tools.pool` (02d_pool): Sandboxes started ahead of their runs, for the callers that choose them:
  `run_python(..., pool=use_pool())`.
- `afm.tools.code_tool` (02d_code_tool): The agent's `code` tool: its python block (and an `sh` block for stdin),
  run in the warm pool, and what it reads.
- `afm.tools.harness` (02e_harness): The program a code grade runs in the sandbox: the tests in one process, the
  solution in another, and a verdict the solution cannot reach.
- `afm.tools.prompts` (02f_prompts): The CoA system prompt of a task kind, from the tool registry: what the
  distilled rows, the rollouts and evaluation all put before the question."""

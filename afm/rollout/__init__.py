"""Episodes and their grades: the multi-turn loop over the engine and the tools, evaluation with intervals, `afm eval`,
and what the records show beyond a score.

Its modules, in the order data flows:

- `afm.rollout.loop` (08_loop): The multi-turn CoA loop over the engine and the tools: token-in/token-out episodes
  with the environment's tokens masked, tools that can fail only their own episode, answers from sampled tokens
  alone, limits that end one episode and never the batch, and a drift check.
- `afm.rollout.evaluate` (08a_evaluate): Any engine on any suite or benchmark, `k` samples per task: graded records
  kept as JSONL that resume after a kill, pass@1, avg@k and the unbiased pass@k per suite with a 95% interval and
  chance beside it, Best-of-N by a verifier, a paired comparison of two models, validation that chooses and a test
  split that only reports; one writer per records file, and a failure of the engine never graded. The command, `afm
  eval`, is the sub-chapter `08a_eval_command`.
- `afm.rollout.eval_command` (08a_eval_command): The evaluation command: a model, in process or served at an
  endpoint, on suites or benchmarks; every flag and file checked before the model loads, records that resume after a
  kill or a failing server, a progress bar, and the per-suite table.
- `afm.rollout.analysis` (08b_analysis): What the episodes behind a score did (`behaviour`), why the failed ones
  failed (`failure_modes`), and the records of several seeds as one set (`pool_seeds`): read from evaluation records
  alone, no model run."""

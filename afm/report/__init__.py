"""What a run reports: the results and their studies, the trajectory browser, the record of a run, the report card, and
the pipeline driver (`afm run`).

Its modules, in the order data flows:

- `afm.report.tables` (11_tables): What the results chapter reports with: the bill of a teacher run and of a CoA
  episode, the efficiency and test-time scaling rows, the paper's tables with ours beside them, the generated suites
  and the ablations from each profile's record, a table written as markdown and CSV, and the rows of the README's
  results table.
- `afm.report.results` (11_results): The studies a run reports, one registration each (how it runs, its tables and
  their reading, its figures and plot, its rows of the README): efficiency (the teacher's multi-agent system against
  the CoA model), test-time scaling, benchmark scores, and the paper's tables, the generated suites and the
  ablations from the records, rows labelled.
- `afm.report.browse` (11a_browse): One static page of trajectories, the teacher's, the distilled rows' and models'
  side by side, with filters.
- `afm.report.record` (11b_record): What a run of the pipeline records besides its figures: the package versions,
  the machine, the commit, a hash of the code each chapter may call, and the records earlier runs left, read without
  a traceback.
- `afm.report.card` (11c_card): `reports/README.md`, the results table and the measured notes of the repository's
  README: every number in them written from the record of a run, none typed by hand.
- `afm.report.pipeline` (12_pipeline): The papermill driver: run the chapters headless for a profile and write
  `reports/` — `metrics.json`, the report card and each chapter's tables and figures."""

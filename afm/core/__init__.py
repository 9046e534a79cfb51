"""What every stage shares: where files live and how they are read, the chapter table, the run profiles and the checks
of every setting, run folders, figures in prose, and command lines made from configs.

Its modules, in the order data flows:

- `afm.core.files` (00a_files): Where afm's files live and how they are read: the cache root, data shipped inside
  installed packages, rows of data files, JSON written whole, the repository and its data folders, and progress bars
  that stay quiet under papermill.
- `afm.core.chapters` (00a_chapters): The chapter table: every notebook of `nbs/` in the order data flows, its wing,
  the module it exports, whether the pipeline runs it, where its figures go and the commands it provides; and the
  parameters each chapter declares, read into a manifest at export, so that an installed afm knows them as a clone
  does.
- `afm.core.settings` (00a_settings): The run profiles of `settings.ini` and the config dataclasses they fill: every
  key type-checked and range-checked where it is set, and a typo named with the key it probably meant.
- `afm.core.runs` (00a_runs): A run's identity and its folder: what made a run, compared path by path with another;
  the folder that holds its checkpoints and the record it finished with, so that a killed run resumes, a finished
  one is read back and another run's folder is refused.
- `afm.core.prose` (00b_prose): The numbers a chapter's findings, the README and the report card state, rendered
  from the figures a run wrote; and the check that finds a number typed by hand.
- `afm.core.args` (00c_args): One parser for every `afm` command: each option in both spellings, help that says each
  default once, boolean switches whose `--no-*` form says what it turns off, and options made from the config
  dataclasses the profiles fill."""

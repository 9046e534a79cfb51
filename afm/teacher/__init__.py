"""The teacher and distillation: the multi-agent system over any chat backend, the offline teacher, the strategies a
trajectory takes, and the filter that turns teacher runs into the SFT set.

Its modules, in the order data flows:

- `afm.teacher.mas` (04_mas): A planner, a search agent, a code agent, a reflection agent, a verifier and an
  orchestrator that solve a task together — every activation recorded, so that distillation can turn the run into
  one Chain-of-Agents trajectory.
- `afm.teacher.offline` (04a_offline): A privileged policy that plays every agent of the teacher from a task's gold
  path, through the real tools.
- `afm.teacher.strategies` (04b_strategies): Which way a trajectory went at each choice a world question offers,
  where a robust way and a fragile way both succeed sometimes: the code tool or arithmetic by hand, the page or the
  search snippet, a double check or none.
- `afm.teacher.distill` (05_distill): Recorded teacher runs → Chain-of-Agents trajectories → the paper's four-stage
  filter → an SFT dataset with its card."""

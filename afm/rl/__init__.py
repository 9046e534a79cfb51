"""Agentic RL: the health log and its guard, the packed training pass, the reward terms, the GRPO trainer with the
rollout loop as its `rollout_func`, its benchmark, and the study of RL against SFT.

Its modules, in the order data flows:

- `afm.rl.health` (10_health): The health log of an RL run: `health.csv`, one row a step of every figure a sick run
  shows first; the guard that checkpoints and stops a run when one of them passes its threshold; and the plots.
- `afm.rl.packed` (10_packed): TRL's `GRPOTrainer` with the episodes of a step packed padding-free into rows for its
  forward, the sampler's log-probabilities checked and corrected by one rule on every path, and the step's figures
  folded over its micro-batches.
- `afm.rl.rewards` (10_rewards): The reward of an RL episode as named, weighted terms on TRL's `reward_funcs`: the
  strict grade, the format term and DAPO's overlong penalty, each read from what the rollout returns of an episode;
  the registry where a term lives, and the hacks tried against it.
- `afm.rl.trainer` (10a_trainer): DAPO-style GRPO on TRL's `GRPOTrainer`, with the CoA rollout loop and its real
  tools as the trainer's `rollout_func`: token in, token out, rewards from strict grades, dynamic sampling, the
  health log and its guard on every step, and `afm rl`.
- `afm.rl.bench` (10b_bench): Where an RL step's seconds go, and what our rollout costs against the library's own
  way: the shares of a step, the engine inside RL against the engine alone, and our rollout against TRL's generation
  path (`afm bench rl`).
- `afm.rl.study` (10c_study): The pipeline's agentic RL: a real step checked token by token, then the seeds study:
  seeds trained from the SFT model the SFT chapter chose, validation choosing each seed's checkpoint, test scoring
  every reported model once (greedy and sampled), RL − SFT paired over questions and pooled over seeds, and the
  study's figures."""

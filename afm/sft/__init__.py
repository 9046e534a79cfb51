"""Agentic SFT: what SFT and RL share, the token rows, the trainer on TRL, the recipe the pipeline reports, and its
benchmark.

Its modules, in the order data flows:

- `afm.sft.training` (09_training): What agentic SFT and agentic RL share: the device and dtype checks (`has_gpu`,
  `slow_bf16`), the loggers a run may report to (`REPORTS`, `check_reporter`), the weight digest each rank writes,
  and when a run is quiet.
- `afm.sft.data` (09a_data): The rows agentic SFT trains on, in every released layout, read as CoA trajectories and
  tokenised with every observation masked out of the loss; the rule for rows that cannot be trained on, packing, and
  attention that stays inside each packed example.
- `afm.sft.trainer` (09b_trainer): One SFT stage on TRL's `SFTTrainer`: its arguments, checked when made;
  padding-free packed training with LoRA or Muon when asked; runs that know their inputs, resume and keep their
  clock; the batch counted in examples; the options a paper-scale run needs; and the model card of every model it
  saves.
- `afm.sft.recipe` (09c_recipe): The pipeline's agentic SFT: the tiny recipe (a copy curriculum, then SFT with every
  observation masked), its stages as runs of their own, whether the model copies, validation choosing among
  candidates and the test split reporting once, the masking ablation and the baselines beside it, and `afm sft`.
- `afm.sft.bench` (09d_bench): How much faster our SFT batches train than TRL's default, side by side on the same
  rows: packed and padding-free with attention per example, the same packing on SDPA, and batches padded to their
  longest example (`afm bench sft`)."""

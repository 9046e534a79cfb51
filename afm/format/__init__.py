"""The Chain-of-Agents trajectory: its tags, how it is parsed and rendered, its grammar, and the loss masks SFT trains
with.

Its modules, in the order data flows:

- `afm.format.coa` (00_coa): One schema from the teacher to the tables: tags, a tolerant parser, a renderer, the
  paper's grammar, stop strings and worked examples.
- `afm.format.masks` (00_masks): Tokenisation with loss labels from character offsets, so that observation tokens
  are masked exactly whatever the tokenizer; the properties of the CoA format tested on generated trajectories; the
  format's figures."""

"""The identity adapter of a pretrained backbone: the fact-dialogue corpus, the unroll, training, evaluation."""

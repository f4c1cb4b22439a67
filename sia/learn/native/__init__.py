"""The native model's corpus, episodes, training and evaluation."""

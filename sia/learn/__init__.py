"""Learning the identity adapter: the fact-dialogue corpus, training and evaluation."""

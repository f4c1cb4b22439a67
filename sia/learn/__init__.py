"""Teaching and measuring: corpora, episodes, training and evaluation. Serving never imports this package."""

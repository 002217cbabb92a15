"""Training the tiny models on the project's license-clean corpus (``python main.py train``)."""

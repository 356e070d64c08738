"""Long-context evaluation: perplexity (``perplexity.py``) and passkey retrieval (``passkey.py``)."""

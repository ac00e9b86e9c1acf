"""Active context selection: which experience answers a question, ranked by measured outcome and packed into a
token budget (the service, its candidates, scoring, rendering, and every weight in config.py)."""

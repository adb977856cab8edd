"""Tool calls and reasoning: how a request's tools constrain and parse a model's output."""

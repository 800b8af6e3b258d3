"""Example agents a reader recognises, runnable against the embedded stack:

    taskplane run examples.research:research_agent --arg "How does KV-cache-aware routing cut cost?"
    taskplane run examples.coding:coding_agent --arg "make test_parser pass"
    taskplane run examples.triage:triage_agent --arg "I was charged twice and cannot log in"

- ``research``: plan, a search tool, several LLM calls, a summary.
- ``coding``: a long loop with a growing conversation and a test tool that takes time
  (the gap a KV cache must survive); continues as new when its history gets long.
- ``triage``: classifies a support ticket and fans out to sub-agents (child tasks).

The worker registers these modules by default. They import nothing at module level
but taskplane and the standard library, and do nothing at import time.
"""

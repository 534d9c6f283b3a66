"""The memory served to agents: an HTTP API (FastAPI, :mod:`retrieval.service.app`)
whose API keys are bound to users, and MCP tools (:mod:`retrieval.service.mcp_tools`) over stdio
(``python -m retrieval.mcp``) and streamable HTTP (``/mcp`` of the same app). The command line is
``python -m retrieval.serve``. The user is always the key's (or the stdio server's ``--user``):
no request field can name another, and another user's ids answer 404.
"""

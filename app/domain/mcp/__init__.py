"""The MCP server at `/mcp`: Memstore's memories as tools for agents, over streamable HTTP.

- `server`: the mount (behind the API-key middleware, like every route), the MCP SDK's session manager
  (stateless, JSON answers) and the handlers that list and call the tools and read the resource;
- `tools`: the seven tools (names fixed) and the resource of a user's memories, each one REST route
  reached without HTTP: its guards, its domain service, its answer;
- `schemas`: the tools' arguments (the routes' own bodies where they take one) and their JSON Schemas.
"""
